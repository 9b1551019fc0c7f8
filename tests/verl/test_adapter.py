"""rewardq.integrations.verl on real verl objects, against real workers started from this verl environment.

Every reward is compared with what verl's own naive manager computes:
``verl.utils.reward_score.default_compute_score`` on the decoded final response.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker
from verl.protocol import DataProto

from rewardq.adapter_settings import AdapterSettings
from rewardq.consumers.batch import build_batch
from rewardq.errors import ConfigError, RunStopped
from rewardq.integrations.verl import RewardqAgentLoopWorker
from rewardq.queue.codec import decode_output, encode_output
from rewardq.queue.keys import Keyspace
from rewardq.reward import rows
from rewardq.reward.rows import FAST_PATH, last_row
from tests.conftest import REDIS_URL, _delete_namespace
from tests.support.managers import expected_reward
from tests.support.sync_client import SyncClient
from tests.verl.conftest import Fleet
from tests.verl.data import TOK, internal, output, row, verl_expected

CASES = [
    # (data_source, ground truth, final response)
    ("openai/gsm8k", "42", "Six times seven. #### 42"),
    ("openai/gsm8k", "42", "I think #### 41"),
    ("openai/gsm8k", "1234", "#### 1,234"),
    ("openai/gsm8k", "42", "no final answer here"),
    ("lighteval/MATH", "\\frac{1}{2}", "so the answer is \\boxed{\\frac{1}{2}}"),
    ("lighteval/MATH", "4", "\\boxed{3}"),
    ("HuggingFaceH4/MATH-500", "10", "\\boxed{10}"),
    ("math_dapo", "42", "Working...\nAnswer: 42"),
    ("math_dapo", "42", "Answer: 7"),
]


def adapter(monkeypatch: pytest.MonkeyPatch, namespace: str, **env: str) -> RewardqAgentLoopWorker:
    """An adapter whose verl __init__ never ran: settings come from REWARDQ_* alone (``zero`` unless
    ``env`` says otherwise: without the trainer's config, ``mask`` refuses at the first failure)."""
    monkeypatch.setenv("REWARDQ_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("REWARDQ_NAMESPACE", namespace)
    monkeypatch.setenv("REWARDQ_VERL_ON_ERROR", "zero")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return object.__new__(RewardqAgentLoopWorker)


def trajectory(
    case: tuple[str, str, str], n_outputs: int, uid: str | None = None, index: int = 0
) -> tuple[list[AgentLoopOutput], dict[str, Any]]:
    data_source, truth, final = case
    earlier = [output(f"turn {i} " + "x" * (3 * i + 1), prompt="Q" * (i + 1)) for i in range(n_outputs - 1)]
    outputs = [*earlier, output(final, prompt="Question? " * n_outputs, tool="<tool>result</tool>" * (n_outputs > 1))]
    return outputs, row(data_source, truth, uid=uid, index=index)


async def test_rewards_match_verls_default_compute_score(monkeypatch: pytest.MonkeyPatch, naive_fleet: Fleet) -> None:
    w = adapter(monkeypatch, naive_fleet.namespace)
    for i, case in enumerate(CASES):
        for n_outputs in (1, 3):  # single-output and multi-output trajectories of different lengths
            outputs, kwargs = trajectory(case, n_outputs, index=i)
            await w._compute_score(outputs, kwargs=kwargs)
            score, extra = verl_expected(outputs, kwargs)
            final = outputs[-1]
            assert isinstance(final.reward_score, float)
            assert (final.reward_score, final.extra_fields["reward_extra_info"]) == (score, extra), case
            assert final.extra_fields["reward_error"] is None
            assert final.metrics.compute_score > 0  # seconds spent, where verl's own puts them
            assert all(o.reward_score is None for o in outputs[:-1])  # verl's layout: the final output only


async def test_two_samples_sharing_a_uid_get_their_own_rewards(
    monkeypatch: pytest.MonkeyPatch, naive_fleet: Fleet
) -> None:
    w = adapter(monkeypatch, naive_fleet.namespace)
    right, kw_right = trajectory(("openai/gsm8k", "42", "#### 42"), 2, uid="shared-uid")
    wrong, kw_wrong = trajectory(("openai/gsm8k", "42", "#### 43"), 1, uid="shared-uid")
    await w._compute_score(right, kwargs=kw_right)
    await w._compute_score(wrong, kwargs=kw_wrong)
    assert (right[-1].reward_score, wrong[-1].reward_score) == (1.0, 0.0)
    # the same uid run again (a re-run group) is scored again, never served the old result
    again, _ = trajectory(("openai/gsm8k", "42", "#### 42"), 1, uid="shared-uid")
    await w._compute_score(again, kwargs=kw_wrong)
    assert again[-1].reward_score == 1.0


async def test_error_results_score_zero_and_pass_verls_postprocess_in_any_order(
    monkeypatch: pytest.MonkeyPatch, failing_fleet: Fleet
) -> None:
    w = adapter(monkeypatch, failing_fleet.namespace)
    dapo, kw_dapo = trajectory(("math_dapo", "42", "Answer: 42"), 1)
    gsm, kw_gsm = trajectory(("openai/gsm8k", "42", "#### 42"), 1)
    unknown, kw_unknown = trajectory(("custom", "42", "FAIL #### 42"), 2)  # the reward function raises
    for outs, kw in ((dapo, kw_dapo), (gsm, kw_gsm), (unknown, kw_unknown)):
        await w._compute_score(outs, kwargs=kw)
    assert unknown[-1].reward_score == 0.0
    assert unknown[-1].extra_fields["reward_extra_info"] == {"acc": 0.0}
    assert "marked to fail" in unknown[-1].extra_fields["reward_error"]
    assert unknown[-1].extra_fields["reward_failure_kind"] == "scorer"
    # a timeout is an error result too: nobody serves this namespace
    nobody = f"{failing_fleet.namespace}-nobody"
    lost = adapter(monkeypatch, nobody, REWARDQ_VERL_TIMEOUT="0.5")
    timed_out, kw_lost = trajectory(("openai/gsm8k", "42", "#### 42"), 1)
    try:
        await lost._compute_score(timed_out, kwargs=kw_lost)
    finally:
        _delete_namespace(REDIS_URL, nobody)  # the pushed trajectory nobody read
    assert timed_out[-1].reward_score == 0.0 and "timed out" in timed_out[-1].extra_fields["reward_error"]
    assert timed_out[-1].extra_fields["reward_failure_kind"] == "transient"

    finals = [dapo[-1], gsm[-1], unknown[-1], timed_out[-1]]
    # verl's own _postprocess fails on such a batch (row 0's keys looked up in every row) ...
    with pytest.raises(KeyError):
        AgentLoopWorker._postprocess(bare_verl_worker(), [internal(o.model_copy(deep=True)) for o in finals])
    # ... and passes, in every order, through the adapter's
    for order in itertools.permutations(finals):
        batch: Any = RewardqAgentLoopWorker._postprocess(  # verl's DataProto
            bare_verl_worker(), [internal(o.model_copy(deep=True)) for o in order]
        )
        rewards = batch.batch["rm_scores"].sum(-1).tolist()
        assert rewards == [o.reward_score for o in order]
        assert set(batch.meta_info["reward_extra_keys"]) == {"score", "acc", "pred"}
        assert [e is not None for e in batch.non_tensor_batch["reward_error"]] == [
            "reward_error" in o.extra_fields and o.extra_fields["reward_error"] is not None for o in order
        ]
    # two agent-loop workers' batches (one with errors, one without) still concatenate
    ok_batch = RewardqAgentLoopWorker._postprocess(bare_verl_worker(), [internal(dapo[-1].model_copy(deep=True))])
    mixed = RewardqAgentLoopWorker._postprocess(
        bare_verl_worker(), [internal(o.model_copy(deep=True)) for o in (unknown[-1], dapo[-1])]
    )
    assert len(DataProto.concat([ok_batch, mixed])) == 3


def bare_verl_worker() -> RewardqAgentLoopWorker:
    w = object.__new__(RewardqAgentLoopWorker)
    w.reward_loop_worker_handles = None  # as when verl runs no reward-loop workers
    return w


async def test_on_error_raise(monkeypatch: pytest.MonkeyPatch, failing_fleet: Fleet) -> None:
    w = adapter(monkeypatch, failing_fleet.namespace, REWARDQ_VERL_ON_ERROR="raise")
    outs, kw = trajectory(("custom", "1", "FAIL"), 1)
    with pytest.raises(RunStopped, match="marked to fail.*verl_on_error=raise from REWARDQ_VERL_ON_ERROR"):
        await w._compute_score(outs, kwargs=kw)
    assert outs[-1].reward_score is None  # nothing was handed to verl


async def test_precomputed_reward_is_not_pushed(
    monkeypatch: pytest.MonkeyPatch, naive_fleet: Fleet, sync_redis: SyncClient
) -> None:
    ns = f"{naive_fleet.namespace}-pre"
    w = adapter(monkeypatch, ns)
    outs, kw = trajectory(("openai/gsm8k", "42", "#### 42"), 2)
    outs[-1].reward_score = 0.25  # scored inside the agent loop (e.g. SWE-agent)
    try:
        await w._compute_score(outs, kwargs=kw)
    finally:
        _delete_namespace(REDIS_URL, ns)
    assert outs[-1].reward_score == 0.25 and "reward_extra_info" not in outs[-1].extra_fields
    assert sync_redis.exists(Keyspace(ns).stream(0)) == 0  # nothing was pushed


async def test_per_output_rewards_land_on_their_own_outputs(monkeypatch: pytest.MonkeyPatch, echo_fleet: Fleet) -> None:
    w = adapter(monkeypatch, echo_fleet.namespace)
    outs, kw = trajectory(("openai/gsm8k", "42", "#### 42"), 3)
    await w._compute_score(outs, kwargs=kw)
    assert [o.reward_score for o in outs] == [expected_reward(o.response_ids) for o in outs]
    assert [o.extra_fields["reward_extra_info"] for o in outs] == [{"i": i, "n": 3} for i in range(3)]


def test_settings_from_the_environment_and_the_verl_config(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "REWARDQ_REDIS_URL": "redis://env-host:6380/2",
        "REWARDQ_NAMESPACE": "env-ns",
        "REWARDQ_VERL_TIMEOUT": "12.5",
        "REWARDQ_VERL_ON_ERROR": "raise",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bare = object.__new__(RewardqAgentLoopWorker)  # verl's __init__ never ran: no self.config
    assert bare.rewardq_scorer().settings == AdapterSettings(
        redis_url="redis://env-host:6380/2", namespace="env-ns", timeout=12.5, on_error="raise"
    )
    # with a verl config, its reward.rewardq block is read; the environment still wins
    for k in ("REWARDQ_NAMESPACE", "REWARDQ_VERL_ON_ERROR"):
        monkeypatch.delenv(k)
    configured = object.__new__(RewardqAgentLoopWorker)
    configured.config = OmegaConf.create(
        {
            "reward": {
                "rewardq": {"namespace": "cfg-ns", "verl_timeout": 30, "verl_on_error": "zero", "cluster": "false"}
            }
        }
    )
    s = configured.rewardq_scorer().settings
    assert (s.redis_url, s.namespace, s.timeout, s.on_error, s.cluster) == (
        "redis://env-host:6380/2",
        "cfg-ns",
        12.5,
        "zero",
        False,
    )
    monkeypatch.setenv("REWARDQ_VERL_ON_ERROR", "ignore")
    with pytest.raises(
        ConfigError,
        match="verl_on_error must be mask, zero or raise, got 'ignore' \\(from env REWARDQ_VERL_ON_ERROR\\)",
    ):
        object.__new__(RewardqAgentLoopWorker).rewardq_scorer()


def test_workers_here_build_batches_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    # verl 0.9.1 pins tensordict <= 0.10, which lacks the private flat-stack helpers: the import
    # probe found the by-hand builders equal to its constructors, and they build the batch
    # (the main run, on the newest tensordict, takes tensordict's own helpers)
    import tensordict

    assert (tensordict.__version__ or "").startswith("0.10")
    assert FAST_PATH is True and rows._flat_stack is rows._stack_by_hand and rows.DIRECT_READS is True
    sample = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "42"}, "raw_prompt": [{"role": "u"}]}
    outputs = [{"prompt_ids": [5] * (i + 1), "response_ids": [7] * 3} for i in range(3)]
    recs = [decode_output(encode_output("u", "s", i, out, sample, final=i == 2)) for i, out in enumerate(outputs)]
    by_hand = build_batch(recs, sample)
    monkeypatch.setattr(rows, "FAST_PATH", False)
    public = build_batch(recs, sample)
    for mine, theirs in ((by_hand, public), (last_row(by_hand), public[-1:])):
        assert type(mine) is type(theirs) and mine.batch_size == theirs.batch_size
        assert sorted(mine.keys()) == sorted(theirs.keys())
        for key in theirs.keys():
            a, b = mine.get(key), theirs.get(key)
            assert type(a) is type(b), key
            assert torch.equal(a, b) if isinstance(b, torch.Tensor) else rows._state(a) == rows._state(b), key
    assert TOK.decode(np.array(TOK.encode("#### 42")), skip_special_tokens=True) == "#### 42"
