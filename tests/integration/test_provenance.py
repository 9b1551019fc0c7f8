"""Every manager's results say what produced them: real workers on the real Redis, one per manager
(naive, dapo, gdpo, rate_limited, remote, disrm, genrm and a custom one), each with the ledger on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewardq import RewardClient, __version__
from rewardq.ledger.read import read_table
from rewardq.queue.keys import Keyspace
from rewardq.queue.provenance import lookup
from tests.support.cli_procs import Procs
from tests.support.helpers import LEDGER_STOP_GRACE, open_test_worker, until, worker_config
from tests.support.judge_standin import JudgeStandin
from tests.support.records import text_output
from tests.support.reward_server import FakeRewardServer, rm_tokenizer_folder
from tests.support.sync_client import SyncClient

SAMPLE = {
    "data_source": "openai/gsm8k",
    "reward_model": {"ground_truth": "42"},
    "raw_prompt": [{"role": "user", "content": "What is 6*7?"}],
}


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JudgeStandin]:
    s = JudgeStandin(tmp_path_factory.mktemp("judge"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reward_model() -> Iterator[FakeRewardServer]:
    s = FakeRewardServer()
    yield s
    s.close()


def managers(judge: JudgeStandin, rm: FakeRewardServer, tmp: Path) -> dict[str, tuple[dict[str, Any], str]]:
    """manager spec -> (its options, the scorer its results must name)."""
    return {
        "naive": ({}, "default:gsm8k"),
        "dapo": (
            {"overlong_buffer": {"enable": True, "len": 8, "penalty_factor": 1.0}, "max_resp_len": 64},
            "default:gsm8k",
        ),
        "gdpo": ({"experiment_name": "exp-1"}, "default:gsm8k"),
        "rate_limited": ({"max_rpm": 6000}, "default:gsm8k"),
        "remote": ({"num_workers": 1}, "default:gsm8k"),
        "disrm": (
            {"base_url": rm.url, "model": "rm-7b", "tokenizer": rm_tokenizer_folder(tmp / "rm-tok")},
            "reward_model:rm-7b",
        ),
        "genrm": ({"base_url": judge.base_url, "model": "judge-model", "temperature": 0.0}, "judge:judge-model"),
        "tests.support.managers:LengthManager": ({}, "manager:tests.support.managers:LengthManager@sha256="),
    }


@pytest.mark.parametrize(
    "spec",
    ["naive", "dapo", "gdpo", "rate_limited", "remote", "disrm", "genrm", "tests.support.managers:LengthManager"],
)
async def test_results_of_every_manager_carry_their_provenance(
    spec: str,
    ns: str,
    redis_url: str,
    tmp_path: Path,
    sync_redis: SyncClient,
    judge: JudgeStandin,
    reward_model: FakeRewardServer,
) -> None:
    options, scorer = managers(judge, reward_model, tmp_path)[spec]
    ledger = str(tmp_path / "ledger")
    client = RewardClient.from_url(redis_url, namespace=ns)
    outs = [text_output("let me think"), text_output("6*7 = 42\n#### 42")]
    keys = client.put_trajectory("u1", "s", outs, SAMPLE)
    w = await open_test_worker(
        worker_config(
            ns, redis_url, manager=spec, manager_options=options, ledger=ledger, shutdown_grace=LEDGER_STOP_GRACE
        )
    )
    task = asyncio.create_task(w.run())
    try:
        await until(lambda: all(v is not None for v in client.get_rewards(keys).values()), "results", timeout=60)
        results = client.get_rewards(keys)
    finally:
        w.request_stop("test done")
        await task
        client.close()
    # Every key's result names one provenance blob, its attempt, and the blob says what scored it
    got = [r for r in results.values() if r is not None]
    assert len(got) == 2 and all(r.ok for r in got), [r.error for r in got]
    assert {r.provenance for r in got} == {got[0].provenance} and len(got[0].provenance) == 16
    assert all(r.attempt == 1 and r.worker == w.name and r.manager == spec for r in got)
    blob = lookup(sync_redis, Keyspace(ns), [got[0].provenance])[got[0].provenance]
    assert blob["scorer"].startswith(scorer), blob
    assert blob["scoring"] == w.presence.scoring and blob["rewardq_version"] == __version__ and blob["manager"] == spec
    rows = read_table(ledger).to_pylist()
    assert [r["provenance"] for r in rows] == [got[0].provenance] * 2 and rows[0]["scorer"] == blob["scorer"]
    if spec == "genrm":
        # a judge's result names the request of its (cached) answer; the blob, the judge's settings
        assert all(len(r.judge_request) == 64 for r in got) and got[0].judge_request == got[1].judge_request
        assert blob["judge_model"] == "judge-model" and len(blob["judge_template"]) == 16
        assert blob["judge_sampling"]["temperature"] == 0.0
        assert [r["judge_request"] for r in rows] == [got[0].judge_request] * 2
        assert json.loads(rows[1]["judge_answer"])["contents"]  # the answer itself, for a replay
    else:
        assert all(r.judge_request == "" for r in got) and "judge_model" not in blob


async def test_a_replay_reuses_the_judges_kept_answers_and_asks_anew_when_the_judge_changed(
    ns: str, redis_url: str, tmp_path: Path, judge: JudgeStandin, procs: Procs
) -> None:
    # Given a ledger of judged trajectories (the answers kept with it)
    ledger = str(tmp_path / "judged")
    options = {"base_url": judge.base_url, "model": "judge-model"}
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys: list[str] = []
    for i in range(6):
        answer = f"#### 42 (try {i})" if i % 2 else f"I think 41 (try {i})"  # six distinct requests
        keys += client.put_trajectory(f"j{i}", "s", [text_output(answer)], SAMPLE)
    w = await open_test_worker(
        worker_config(
            ns, redis_url, manager="genrm", manager_options=options, ledger=ledger, shutdown_grace=LEDGER_STOP_GRACE
        )
    )
    task = asyncio.create_task(w.run())
    try:
        await until(lambda: all(v is not None for v in client.get_rewards(keys).values()), "results", timeout=60)
    finally:
        w.request_stop("test done")
        await task
        client.close()
    served = judge.stats()["served"]
    assert served >= 6

    def replay(out: str, model: str) -> dict[str, Any]:
        argv = ["replay", ledger, "--out", out, "--tokenizer", "builtin:demo", "--manager", "genrm", "--json"]
        argv += ["--manager-option", f"base_url={judge.base_url}", "--manager-option", f"model={model}"]
        code, p = procs.run(argv, timeout=180.0, tag="replay")  # the worker above has stopped: nothing to wait for
        assert code == 0, p.stderr()[-3000:]
        result: dict[str, Any] = json.loads(p.stdout().strip().splitlines()[-1])
        return result

    # When it is replayed with the same judge: every answer comes from the kept ones, none is paid again
    same = str(tmp_path / "same")
    assert replay(same, "judge-model")["replayed"] == 6
    assert judge.stats()["served"] == served
    before = {r["key"]: r["reward_score"] for r in read_table(ledger).to_pylist()}
    after = read_table(same).to_pylist()
    assert {r["key"]: r["reward_score"] for r in after} == before
    assert all(json.loads(r["reward_extra_info"])["judge_cached"] for r in after)
    # And with another judge model, the judge is asked anew
    replay(str(tmp_path / "other"), "judge-model-2")
    assert judge.stats()["served"] == served + 6
