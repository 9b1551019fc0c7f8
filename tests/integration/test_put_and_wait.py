"""``AsyncRewardClient.put_trajectory_and_wait``: the put and the wait, with one read of the results
fewer than ``put_trajectory`` + ``wait_rewards`` (the waiter listens before the put)."""

from __future__ import annotations

import asyncio

import pytest

from rewardq import AsyncRewardClient
from rewardq.errors import RewardTimeout
from rewardq.producers.reading import parse_results
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RewardResult
from tests.support.helpers import SAMPLE, count_reads, output, running_workers
from tests.support.managers import LengthManager
from tests.support.sync_client import SyncClient


async def test_concurrent_trajectories_get_their_own_rewards(
    ns: str, redis_url: str, length_manager: LengthManager
) -> None:
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    async with running_workers(ns, redis_url, [length_manager], concurrency=8):

        async def one(t: int) -> tuple[list[str], dict[str, RewardResult]]:
            outs = [output(4, 3, seed=t), output(5, t % 7 + 1, seed=t + 1)]
            return await client.put_trajectory_and_wait(f"u{t}", "s", outs, SAMPLE, timeout=30)

        got = await asyncio.gather(*(one(t) for t in range(60)))
    await client.aclose()
    for t, (keys, results) in enumerate(got):
        assert keys == [f"u{t}_s_0", f"u{t}_s_1"] and list(results) == keys
        assert [r.reward_score for r in results.values()] == [float(t % 7 + 1)] * 2


async def test_the_results_are_read_after_the_put_not_before(
    ns: str, redis_url: str, sync_redis: SyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    reads = count_reads(client, monkeypatch)
    # nobody scores this namespace: the wait times out, naming the keys, after the put went in
    with pytest.raises(RewardTimeout) as err:
        await client.put_trajectory_and_wait("lonely", "s", [output(3, 3), output(2, 2)], SAMPLE, timeout=0.5)
    assert err.value.missing == ["lonely_s_0", "lonely_s_1"]
    assert sync_redis.xlen(Keyspace(ns).stream(0)) == 2
    assert reads == [["lonely_s_0", "lonely_s_1"]]  # one read, at the deadline; none before the put
    # wait_rewards alone reads first (the trajectory may have finished before it was called)
    reads.clear()
    with pytest.raises(RewardTimeout):
        await client.wait_rewards(["lonely_s_0", "lonely_s_1"], timeout=0.5)
    assert len(reads) == 2
    await client.aclose()


async def test_a_bad_record_is_refused_before_anything_is_sent(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    from rewardq.errors import RecordError

    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    with pytest.raises(RecordError, match="response_ids"):
        await client.put_trajectory_and_wait("u", "s", [output(3, 3), {"prompt_ids": [1], "response_ids": [-1]}])
    assert sync_redis.xlen(Keyspace(ns).stream(0)) == 0
    assert not client._watchers  # the waiter it registered is gone again
    await client.aclose()


async def test_waiters_that_start_together_share_one_watcher(
    ns: str, redis_url: str, length_manager: LengthManager
) -> None:
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)

    def watchers() -> int:
        return sum(1 for t in asyncio.all_tasks() if t.get_name() == "rewardq-done-watcher" and not t.done())

    async with running_workers(ns, redis_url, [length_manager], concurrency=16):
        put_and_waited, waited = await asyncio.gather(
            asyncio.gather(
                *(
                    client.put_trajectory_and_wait(f"a{t}", "s", [output(3, t % 5 + 1)], SAMPLE, timeout=30)
                    for t in range(150)
                )
            ),
            asyncio.gather(*(client.wait_rewards([f"a{t}_s_0"], timeout=30) for t in range(150))),
        )
        assert watchers() == 1  # each used to start its own, each holding a pooled connection in XREAD
    assert [r.reward_score for _, res in put_and_waited for r in res.values()] == [float(t % 5 + 1) for t in range(150)]
    assert all(res[f"a{t}_s_0"].reward_score == float(t % 5 + 1) for t, res in enumerate(waited))
    await client.aclose()
    assert watchers() == 0


async def test_one_read_of_the_trajectory_gives_what_each_result_hash_holds(
    ns: str, redis_url: str, sync_redis: SyncClient, length_manager: LengthManager
) -> None:
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    async with running_workers(ns, redis_url, [length_manager]):
        outs = [output(4, 3, seed=1), output(5, 2, seed=2), output(3, 6, seed=3)]
        keys, results = await client.put_trajectory_and_wait("one", "s", outs, SAMPLE, timeout=30)
    ks = Keyspace(ns)
    # The per-key hashes stay the results' home: what redis-cli HGETALL shows of each key
    assert parse_results(keys, [sync_redis.hgetall(ks.reward_key(k)) for k in keys]) == results
    assert [r.reward_score for r in results.values()] == [6.0] * 3
    # And the trajectory's hash holds the same result once, for every key
    h = sync_redis.hgetall(ks.traj_key("one_s"))
    assert h[b"result_rows"] == b"1" and h[b"result:0:status"] == b"ok" and b"result:1:status" not in h
    assert await client.get_rewards(keys) == results
    # A trajectory without that copy (results written by fail or expire) is read key by key
    sync_redis.execute_command("HDEL", ks.traj_key("one_s"), "result_rows")
    assert await client.get_rewards(keys) == results
    await client.aclose()


async def test_a_small_shared_result_comes_with_the_announcement_and_needs_no_read(
    ns: str, redis_url: str, sync_redis: SyncClient, length_manager: LengthManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    reads = count_reads(client, monkeypatch)
    async with running_workers(ns, redis_url, [length_manager]):
        outs = [output(4, 3, seed=1), output(5, 2, seed=2), output(3, 6, seed=3)]
        keys, results = await client.put_trajectory_and_wait("told", "s", outs, SAMPLE, timeout=30)
    ks = Keyspace(ns)
    assert reads == []  # the done entry carried the result
    assert parse_results(keys, [sync_redis.hgetall(ks.reward_key(k)) for k in keys]) == results
    assert [r.reward_score for r in results.values()] == [6.0] * 3
    results[keys[0]].reward_extra_info["changed"] = True  # each key's extra info is its own
    assert "changed" not in results[keys[1]].reward_extra_info
    entry = sync_redis.xrange(ks.done(0))[-1][1]
    assert entry[b"result_rows"] == b"1" and entry[b"result:0:status"] == b"ok"
    assert not client._announced  # forgotten once its waiter has it
    await client.aclose()
