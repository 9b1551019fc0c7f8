"""End-to-end behaviour of the core pipeline, in-process workers on the real Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rewardq import AsyncRewardClient, RewardClient
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RewardResult
from rewardq.reward.rows import valid_response_ids
from tests.support.checks import must
from tests.support.helpers import SAMPLE, open_test_worker, output, running_workers
from tests.support.managers import LengthManager
from tests.support.sync_client import SyncClient


async def test_trajectory_scored_once_and_copied_to_every_key(
    ns: str, redis_url: str, length_manager: LengthManager, sync_redis: SyncClient
) -> None:
    # Given a trajectory whose outputs have very different prompt and response lengths
    lens = [(50, 300), (700, 10), (5, 1200), (120, 0), (300, 77)]
    outs = [output(p, r, seed=i, num_turns=2 * i + 1, extra_fields={"turn": i}) for i, (p, r) in enumerate(lens)]
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    keys = await client.put_trajectory("uid_with_underscores", "sess-1", outs, SAMPLE)
    assert keys == [f"uid_with_underscores_sess-1_{i}" for i in range(5)]
    # When one worker scores it
    async with running_workers(ns, redis_url, [length_manager]):
        results = await client.wait_rewards(keys, timeout=20)
    await client.aclose()
    # Then every key has the final output's reward and extra info, scored exactly once
    assert [r.reward_score for r in results.values()] == [77.0] * 5
    assert all(r.status == "ok" and r.error is None for r in results.values())
    assert all(r.reward_extra_info == {"rows": 5, "gt": "42"} for r in results.values())
    assert len(LengthManager.calls) == 1
    batch = LengthManager.calls[0]
    assert batch.batch_size == torch.Size([5])
    # And every row's valid response decodes exactly, whatever the other rows' lengths
    for i, o in enumerate(outs):
        assert np.array_equal(valid_response_ids(batch[i]).numpy(), o["response_ids"])
        assert batch[i]["__num_turns__"] == 2 * i + 1
        assert batch[i]["tool_extra_fields"] == {"turn": i}
    assert sync_redis.xlen(Keyspace(ns).done(0)) == 1
    # And the stored result is readable text for redis-cli
    raw = sync_redis.hgetall(Keyspace(ns).reward_key(keys[0]))
    assert raw[b"reward_score"] == b"77.0" and raw[b"reward_extra_info"] == b'{"rows":5,"gt":"42"}'


async def test_out_of_order_arrival_and_two_workers_assemble_once(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    managers = [LengthManager(None), LengthManager(None)]
    LengthManager.calls = []
    client = RewardClient.from_url(redis_url, namespace=ns)
    n_traj, keys = 60, []
    async with running_workers(ns, redis_url, managers, batch_size=1):
        for t in range(n_traj):
            order = [3, 0, 2, 1] if t % 2 else [1, 3, 0, 2]  # final output arrives early half the time
            for i in order:
                keys.append(client.put_output(f"u{t}", "s", i, output(10 + i, 20 + t, seed=t), SAMPLE, final=(i == 3)))
        results = await asyncio.to_thread(client.wait_rewards, keys, 30)
    for k, r in results.items():
        t = int(k.split("_")[0][1:])
        assert r.reward_score == 20 + t, k
    assert len(LengthManager.calls) == n_traj
    assert sync_redis.xlen(Keyspace(ns).done(0)) == n_traj
    # parked records were acked and deleted; nothing is left pending or in the stream
    assert sync_redis.xlen(Keyspace(ns).stream(0)) == 0
    assert sync_redis.xpending(Keyspace(ns).stream(0), Keyspace(ns).group)["pending"] == 0
    client.close()


async def test_outputs_read_by_different_workers_are_scored_once(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    """Worker A reads output 0, worker B reads the final output: B assembles and scores."""
    from tests.support.helpers import worker_config

    client = RewardClient.from_url(redis_url, namespace=ns)
    a = await open_test_worker(worker_config(ns, redis_url, name="A"), manager=LengthManager(None))
    b = await open_test_worker(worker_config(ns, redis_url, name="B"), manager=LengthManager(None))
    LengthManager.calls = []
    try:
        client.put_output("u", "s", 0, output(5, 9), SAMPLE)
        got_a = await a.broker.read([0], 10, None)
        client.put_output("u", "s", 1, output(6, 4), SAMPLE, final=True)
        got_b = await b.broker.read([0], 10, None)
        assert [e.key for e in got_a] == ["u_s_0"] and [e.key for e in got_b] == ["u_s_1"]
        await a.handle(got_a)
        assert a.stats["parked"] == 1 and not a.in_flight
        await b.handle(got_b)
        await asyncio.gather(*(must(f.task) for f in list(b.in_flight.values())))
        res = client.wait_rewards(["u_s_0", "u_s_1"], timeout=5)
        assert [r.reward_score for r in res.values()] == [4.0, 4.0]
        assert {r.worker for r in res.values()} == {"B"}
        assert len(LengthManager.calls) == 1
    finally:
        await a.stop()
        await b.stop()
        client.close()


async def test_ids_as_lists_numpy_and_torch_and_verl_like_objects(
    ns: str, redis_url: str, length_manager: LengthManager
) -> None:
    class AgentLoopOutput:  # duck-typed verl output
        def __init__(self) -> None:
            self.prompt_ids = torch.tensor([1, 2, 3])
            self.response_ids = torch.tensor([4, 5, 6, 7])
            self.response_mask = torch.tensor([1, 1, 0, 1])
            self.response_logprobs = [0.1, 0.2, 0.3, 0.4]
            self.num_turns = 2
            self.extra_fields = {"tool": "calc"}
            self.reward_score = None

    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    k1 = await client.put_trajectory("a", 1, [{"prompt_ids": [1, 2], "response_ids": np.array([3, 4, 5])}], SAMPLE)
    k2 = await client.put_trajectory("b", 1, [AgentLoopOutput()], SAMPLE)
    async with running_workers(ns, redis_url, [length_manager]):
        res = await client.wait_rewards(k1 + k2, timeout=10)
    assert [r.reward_score for r in res.values()] == [3.0, 4.0]
    batch = LengthManager.calls[-1] if LengthManager.calls[-1].batch_size[0] == 1 else None
    assert batch is not None
    await client.aclose()


async def test_get_rewards_reports_missing_and_wait_times_out_naming_keys(ns: str, redis_url: str) -> None:
    from rewardq.errors import RewardTimeout

    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = client.put_trajectory("lonely", "s", [output(3, 3)], SAMPLE)
    assert client.get_rewards(keys) == {keys[0]: None}
    with pytest.raises(TimeoutError) as info:
        client.wait_rewards(keys, timeout=0.3)
    assert isinstance(info.value, RewardTimeout)
    assert info.value.missing == keys and keys[0] in str(info.value)
    client.close()


async def test_many_concurrent_async_waiters(ns: str, redis_url: str, length_manager: LengthManager) -> None:
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    async with running_workers(ns, redis_url, [length_manager], concurrency=8):

        async def one(t: int) -> dict[str, RewardResult]:
            keys = await client.put_trajectory(f"u{t}", "s", [output(4, t % 7 + 1)] * 2, SAMPLE)
            return await client.wait_rewards(keys, timeout=20)

        all_res = await asyncio.gather(*(one(t) for t in range(100)))
    for t, res in enumerate(all_res):
        assert [r.reward_score for r in res.values()] == [float(t % 7 + 1)] * 2
    await client.aclose()


async def test_concurrency_bounds_scoring_even_within_one_read_batch(ns: str, redis_url: str) -> None:
    from rewardq.reward.base import RewardManager

    class Counting(RewardManager):
        now = peak = 0

        async def run_single(self, data: TensorDict) -> dict[str, Any]:
            type(self).now += 1
            type(self).peak = max(type(self).peak, type(self).now)
            await asyncio.sleep(0.05)
            type(self).now -= 1
            return {"reward_score": 1.0, "reward_extra_info": {}}

    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = [k for t in range(20) for k in client.put_trajectory(f"c{t}", "s", [output(2, 2)], SAMPLE)]
    async with running_workers(ns, redis_url, [Counting(None)], concurrency=3, batch_size=100):
        res = await asyncio.to_thread(client.wait_rewards, keys, 20)
    assert len(res) == 20 and Counting.peak == 3
    client.close()


async def test_own_process_worker_freezes_the_start_up_heap_before_it_reads(
    ns: str, redis_url: str, length_manager: LengthManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker run as a process's own (as `rewardq worker` runs it); gc.freeze is
    # recorded, not done, so the test process's heap is left alone
    import gc

    from rewardq.consumers.process import GC_YOUNG_THRESHOLD
    from tests.support.helpers import worker_config

    seen: list[str] = []
    w = await open_test_worker(worker_config(ns, redis_url, name="frozen"), manager=length_manager)
    monkeypatch.setattr(gc, "collect", lambda: seen.append("collect"))
    monkeypatch.setattr(gc, "freeze", lambda: seen.append("freeze"))
    monkeypatch.setattr(gc, "set_threshold", lambda *t: seen.append(f"threshold {t[0]}"))
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    task = asyncio.create_task(w.run(freeze_heap=True))
    # When it scores a trajectory and stops
    keys = await client.put_trajectory("u", "s", [output(3, 4)], SAMPLE)
    got = await client.wait_rewards(keys, timeout=20)
    w.request_stop("test done")
    await task
    await client.aclose()
    # Then it collected, froze and raised the young threshold once (after it was open: the
    # manager set up), and still scored
    assert seen == ["collect", "freeze", f"threshold {max(gc.get_threshold()[0], GC_YOUNG_THRESHOLD)}"]
    assert got[keys[0]].ok
    # And a worker embedded in someone else's process (the default) never touches the GC
    seen.clear()
    async with running_workers(ns, redis_url, [length_manager]):
        await asyncio.sleep(0.2)
    assert seen == []
