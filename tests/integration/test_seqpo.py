"""The SeqPO-SiMT example (tests/support/seqpo_simt): a reward that needs every output of the
trajectory, scored by real workers and discovered through an entry point as a package's would be."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tensordict import TensorDict

from rewardq import RewardClient
from rewardq.consumers.batch import build_batch
from rewardq.errors import ScoringError
from rewardq.queue.codec import decode_output, encode_output
from rewardq.reward.registry import ENTRY_POINT_GROUP, get_manager_class, known_managers
from rewardq.reward.tokenizer import Tokenizer, load_tokenizer
from tests.support.checks import must, per_output, single
from tests.support.entry_points import installed_entry_points
from tests.support.helpers import running_workers
from tests.support.seqpo_simt import ENTRY_POINT
from tests.support.seqpo_simt.data import make_simt_trajectories
from tests.support.seqpo_simt.manager import SeqPOSiMTManager, fused_reward
from tests.support.seqpo_simt.metrics import average_lagging, chrf


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer("builtin:demo")


def _batch(traj: dict[str, Any]) -> TensorDict:
    n = len(traj["outputs"])
    recs = [
        decode_output(encode_output(traj["uid"], traj["session_id"], i, o, traj["sample"], final=(i == n - 1)))
        for i, o in enumerate(traj["outputs"])
    ]
    return build_batch(recs)


def test_metrics_exact_values() -> None:
    assert chrf("abc", "abc") == 1.0 and chrf("xyz", "abc") == 0.0
    assert 0 < chrf("the cat sat", "the cat sat down") < 1
    assert average_lagging([3, 3, 3], 3) == 3.0
    assert average_lagging([1, 2, 3], 3) == 1.0
    # |x|=4, |y|=2 (γ=0.5): g=(2,4) -> τ=2, AL = ((2-0) + (4-2))/2 = 2.0
    assert average_lagging([2, 4], 4) == 2.0
    assert average_lagging([], 5) == 5.0
    r = fused_reward(["ab", "", "cd"], [1, 2, 2], "ab cd", 2, latency_weight=0.5)
    # delays (1, 2), γ = 1, τ = 2: AL = ((1-0) + (2-1))/2 = 1.0, L = 0.5, Q = 1
    assert r["quality"] == 1.0 and r["average_lagging"] == 1.0 and r["score"] == pytest.approx(0.75)


async def test_reward_needs_every_output(tok: Tokenizer) -> None:
    trajs = make_simt_trajectories(30, seed=1, tokenizer=tok)
    m = SeqPOSiMTManager(tok)
    differs = 0
    for traj in trajs:
        batch = _batch(traj)
        got = single(await m.run_single(batch))
        assert got["reward_score"] == pytest.approx(traj["expected"]["score"], abs=1e-12)
        assert got["reward_extra_info"]["average_lagging"] == pytest.approx(traj["expected"]["average_lagging"])
        if len(traj["outputs"]) > 1:
            last_only = single(await m.run_single(batch[-1:]))
            differs += last_only["reward_score"] != pytest.approx(got["reward_score"])
    assert differs >= 20  # the last output alone gives another (wrong) number


async def test_same_final_output_different_history_different_reward(tok: Tokenizer) -> None:
    m = SeqPOSiMTManager(tok, latency_weight=1.0)
    sample = {"data_source": "simt", "reward_model": {"ground_truth": "a b c d"}, "extra_info": {"source": "w x y z"}}

    def traj(steps: list[tuple[str, int]]) -> TensorDict:
        outs = [
            {"prompt_ids": tok.encode("p"), "response_ids": tok.encode(c), "extra_fields": {"source_read": r}}
            for c, r in steps
        ]
        return _batch({"uid": "u", "session_id": "s", "outputs": outs, "sample": sample})

    eager = single(await m.run_single(traj([("a", 1), ("b", 2), ("c", 3), ("d", 4)])))
    lazy = single(await m.run_single(traj([("", 1), ("", 2), ("a b c", 3), ("d", 4)])))
    assert eager["reward_extra_info"]["quality"] == lazy["reward_extra_info"]["quality"] == 1.0
    assert eager["reward_extra_info"]["average_lagging"] == 1.0
    # delays (3, 3, 3, 4), γ = 1, τ = 4: AL = (3 + 2 + 1 + 1) / 4
    assert lazy["reward_extra_info"]["average_lagging"] == 1.75
    assert eager["reward_score"] == pytest.approx(0.75) and lazy["reward_score"] == pytest.approx(1 - 1.75 / 4)


async def test_per_step_rewards_telescope_to_the_trajectory_reward(tok: Tokenizer) -> None:
    trajs = make_simt_trajectories(10, seed=2, tokenizer=tok)
    full_m, step_m = SeqPOSiMTManager(tok), SeqPOSiMTManager(tok, per_step=True)
    for traj in trajs:
        batch = _batch(traj)
        full = single(await full_m.run_single(batch))
        steps = per_output(await step_m.run_single(batch))
        assert len(steps) == len(traj["outputs"])
        assert sum(s["reward_score"] for s in steps) == pytest.approx(full["reward_score"])


async def test_bad_step_data_is_a_clear_scoring_error(tok: Tokenizer) -> None:
    traj = make_simt_trajectories(1, seed=3, tokenizer=tok)[0]
    traj["outputs"][0]["extra_fields"] = {}
    with pytest.raises(ScoringError, match="output 0: extra_fields\\['source_read'\\]"):
        await SeqPOSiMTManager(tok).run_single(_batch(traj))


def test_discovered_through_entry_point(tmp_path: Path) -> None:
    assert "seqpo_simt" not in known_managers()  # rewardq itself ships no example
    with installed_entry_points(tmp_path, ENTRY_POINT_GROUP, ENTRY_POINT):
        assert "seqpo_simt" in known_managers()
        assert get_manager_class("seqpo_simt") is SeqPOSiMTManager


@pytest.mark.parametrize("per_step", [False, True])
async def test_scored_end_to_end_through_workers(ns: str, redis_url: str, tok: Tokenizer, per_step: bool) -> None:
    trajs = make_simt_trajectories(40, seed=4, tokenizer=tok)
    client = RewardClient.from_url(redis_url, namespace=ns)
    all_keys = {t["uid"]: client.put_trajectory(t["uid"], t["session_id"], t["outputs"], t["sample"]) for t in trajs}
    managers = [SeqPOSiMTManager(tok, per_step=per_step), SeqPOSiMTManager(tok, per_step=per_step)]
    async with running_workers(ns, redis_url, managers, manager=ENTRY_POINT["seqpo_simt"]):
        res = await asyncio.to_thread(client.wait_rewards, [k for ks in all_keys.values() for k in ks], 30)
    for t in trajs:
        scores = [must(res[k].reward_score) for k in all_keys[t["uid"]]]
        if per_step:
            assert sum(scores) == pytest.approx(t["expected"]["score"])
            assert [res[k].reward_extra_info["step"] for k in all_keys[t["uid"]]] == list(range(len(scores)))
        else:
            assert scores == [pytest.approx(t["expected"]["score"])] * len(scores)
    client.close()
