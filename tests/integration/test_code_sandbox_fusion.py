"""SandboxFusion end to end: real workers, the real Redis, and the local stand-in server, which
really runs each submitted program and counts the runs in flight."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewardq import AsyncRewardClient, RewardClient
from rewardq.reward.base import ManagerContext, RewardManager
from rewardq.reward.factory import build_manager
from tests.support.cli_procs import START_WAIT, Proc, Procs, wait_for, worker_argv
from tests.support.helpers import running_workers
from tests.support.records import TOK, text_output
from tests.support.redis_server import free_port
from tests.support.sandbox_standin import Standin
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.timeout(600)

ADD = json.dumps({"inputs": ["2 3\n"], "outputs": ["5\n"]})
RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\nprint(0)\n```"
SAMPLE = {"data_source": "taco", "reward_model": {"ground_truth": ADD}, "extra_info": {}}


def _output(text: str) -> dict[str, Any]:
    return text_output(text, "Add them.")


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Standin]:
    s = Standin(tmp_path)
    yield s
    s.stop()


def test_500_trajectories_two_workers_never_more_than_4_runs_at_once(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, standin: Standin
) -> None:
    # Given two worker processes sharing sandbox_fusion_max_concurrent=4, each willing to score 32 at once
    def worker(name: str) -> Proc:
        return procs.start(
            worker_argv(
                redis_url,
                ns,
                name,
                "--concurrency",
                "32",
                "--manager-option",
                f"sandbox_fusion_url={standin.url}",
                "--manager-option",
                "sandbox_fusion_max_concurrent=4",
                "--manager-option",
                "sandbox_fusion_memory_limit_mb=256",
                "--log-level",
                "WARNING",
            ),
            tag=name,
        )

    workers = [worker(f"sf{i}") for i in range(2)]
    wait_for(
        lambda: all(sync_redis.exists(f"{ns}:worker:sf{i}") for i in range(2)), START_WAIT, "heartbeats", procs=workers
    )
    # When 500 code trajectories arrive (every fifth one wrong)
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = [
        client.put_trajectory(f"t{i}", "0", [_output(WRONG if i % 5 == 0 else RIGHT)], SAMPLE)[0] for i in range(500)
    ]
    res = client.wait_rewards(keys, timeout=480)
    # Then every trajectory got its reward, from both workers
    assert all(r.ok for r in res.values()), [r.error for r in res.values() if not r.ok][:3]
    assert [res[k].reward_score for k in keys] == [0.0 if i % 5 == 0 else 1.0 for i in range(500)]
    assert {r.reward_extra_info["code_backend"] for r in res.values()} == {"sandbox_fusion"}
    assert {r.worker for r in res.values()} == {"sf0", "sf1"}
    # ... and the sandbox ran each program once, never more than 4 at a time, with the memory limit passed through
    stats = standin.stats()
    assert stats["runs"] == 500
    assert stats["max_in_flight"] <= 4, stats
    assert stats["max_in_flight"] == 4, stats  # the limit was reached, not merely respected by an idle fleet
    assert stats["memory_limits"] == [256]
    client.close()
    for w in workers:
        assert w.terminate() == 0, w.stderr()[-2000:]


def _manager(ns: str, redis_url: str, **options: Any) -> RewardManager:
    return build_manager(
        "naive",
        tokenizer=TOK,
        options=options,
        context=ManagerContext(redis_url=redis_url, namespace=ns, worker_name="w0"),
    )


async def test_a_down_sandbox_gives_transient_error_results_naming_it(redis_url: str, ns: str) -> None:
    # Given a worker pointed at a sandbox nobody listens on, retrying in place for 2 s
    url = f"http://127.0.0.1:{free_port()}/run_code"
    manager = _manager(ns, redis_url, sandbox_fusion_url=url)
    async with running_workers(ns, redis_url, [manager], retry_for=2.0):
        client = AsyncRewardClient.from_url(redis_url, namespace=ns)
        started = time.monotonic()
        # When a code trajectory and a GSM8K one arrive
        code_key = (await client.put_trajectory("c", "0", [_output(RIGHT)], SAMPLE))[0]
        math = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "5"}}
        math_key = (await client.put_trajectory("m", "0", [_output("so #### 5")], math))[0]
        res = await client.wait_rewards([code_key, math_key], timeout=60)
        # Then the code trajectory ends in an error result naming the sandbox, soon; the other is scored
        err = res[code_key]
        assert err.status == "error" and err.failure_kind == "transient" and url in (err.error or "")
        assert "could not be reached" in (err.error or "") and "retry_for=2s ran out" in (err.error or "")
        assert 2.0 <= time.monotonic() - started < 30
        assert res[math_key].ok and res[math_key].reward_score == 1.0
        await client.aclose()


async def test_5xx_answers_are_retried_and_a_hung_sandbox_times_out(redis_url: str, ns: str, standin: Standin) -> None:
    # Given a sandbox that answers 503 twice, then works, and a worker retrying in place for 3 s
    await asyncio.to_thread(standin.control, fail_next=2, status=503)
    manager = _manager(ns, redis_url, sandbox_fusion_url=standin.url, sandbox_fusion_run_timeout=0.5)
    async with running_workers(ns, redis_url, [manager], retry_for=3.0):
        client = AsyncRewardClient.from_url(redis_url, namespace=ns)
        # When a trajectory arrives, it is scored after the retries
        key = (await client.put_trajectory("r", "0", [_output(RIGHT)], SAMPLE))[0]
        r = (await client.wait_rewards([key], timeout=60))[key]
        assert r.ok and r.reward_score == 1.0
        # When the sandbox hangs (answers after 60 s), the request gives up after compile + run + 10 s
        await asyncio.to_thread(standin.control, delay=60)
        started = time.monotonic()
        key = (await client.put_trajectory("h", "0", [_output(RIGHT)], SAMPLE))[0]
        r = (await client.wait_rewards([key], timeout=60))[key]
        assert r.status == "error" and r.failure_kind == "transient"
        assert "did not answer within 11s" in (r.error or "") and "retry_for=3s ran out" in (r.error or "")
        assert time.monotonic() - started < 30
        await client.aclose()
