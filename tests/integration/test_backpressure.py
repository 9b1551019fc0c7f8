"""Backpressure without loss, and the clean-up schedule (real Redis, in-process workers).

* past ``max_backlog`` unprocessed entries, producers wait instead of growing the stream;
  they go on as soon as workers drain it, and raise BackpressureTimeout (a TimeoutError
  that says what to do) when nobody does;
* nothing unprocessed is ever trimmed; processed entries are removed from the stream;
* results and finished trajectories expire after ``result_ttl`` (0 keeps them).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from rewardq import AsyncRewardClient, BackpressureTimeout, RewardClient, RewardqError
from rewardq.queue.keys import Keyspace
from tests.support.exactly_once import make_trajectories, push, settle
from tests.support.helpers import running_workers
from tests.support.managers import EchoManager
from tests.support.sync_client import SyncClient

FAST: dict[str, Any] = dict(
    heartbeat_interval=0.2, lease_seconds=1.5, maintenance_interval=0.2, claim_idle=2.0, block_ms=100
)


async def test_producer_waits_at_max_backlog_and_goes_on_when_workers_drain(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    jobs = make_trajectories(13, seed=1, max_outputs=1)
    client = RewardClient.from_url(redis_url, namespace=ns, max_backlog=10, backpressure_timeout=60)
    # Given a stream already holding max_backlog unprocessed entries
    keys = push(client, jobs[:10])
    assert sync_redis.xlen(ks.stream(0)) == 10
    # When a producer pushes more with no worker running, it waits instead of growing Redis
    late: list[str] = []
    t = threading.Thread(target=lambda: late.extend(push(client, jobs[10:])))
    t.start()
    await asyncio.sleep(1.5)
    assert t.is_alive(), "the producer did not wait for the backlog to shrink"
    assert sync_redis.xlen(ks.stream(0)) == 10
    # Then as soon as a worker drains the stream, the producer carries on, and nothing is lost
    async with running_workers(ns, redis_url, [EchoManager()], **FAST):
        await asyncio.to_thread(t.join, 60)
        assert not t.is_alive()
        await asyncio.to_thread(client.wait_rewards, keys + late, 30)
    verdict = settle(sync_redis, ks, {k: v for j in jobs for k, v in j.expected.items()})
    assert verdict.clean and len(late) == 3, verdict.explain()
    assert verdict.leftovers == {"stream": 0, "pending": 0, "waiting": 0, "dead": 0}
    client.close()


async def test_backpressure_timeout_is_a_clear_timeout_error(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    ks = Keyspace(ns)
    jobs = make_trajectories(6, seed=2, max_outputs=1)
    client = RewardClient.from_url(redis_url, namespace=ns, max_backlog=5, backpressure_timeout=0.5)
    push(client, jobs[:5])
    t0 = time.monotonic()
    with pytest.raises(BackpressureTimeout) as info:
        push(client, jobs[5:])
    assert time.monotonic() - t0 >= 0.5
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, RewardqError)
    text = str(err)
    assert "5 unprocessed entries" in text and "max_backlog=5" in text and "0.5s" in text
    assert "rewardq worker" in text and "rewardq status" in text  # says what to do
    assert sync_redis.xlen(ks.stream(0)) == 5  # the refused trajectory was not half-sent
    client.close()

    aclient = AsyncRewardClient.from_url(redis_url, namespace=ns, max_backlog=5, backpressure_timeout=0.3)
    try:
        await aclient.put_trajectory("a", "s", jobs[5].outputs)  # learns the length: now full
        with pytest.raises(BackpressureTimeout, match="max_backlog=5"):
            await aclient.put_trajectory("b", "s", jobs[5].outputs)
    finally:
        await aclient.aclose()
    assert sync_redis.xlen(ks.stream(0)) == 6


async def test_unprocessed_entries_are_never_trimmed_and_processed_ones_are_removed(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    jobs = make_trajectories(40, seed=3, max_outputs=4)
    client = RewardClient.from_url(redis_url, namespace=ns, max_backlog=None)
    keys = push(client, jobs)
    # Given no worker: every entry stays, however many there are
    assert sync_redis.xlen(ks.stream(0)) == len(keys)
    async with running_workers(ns, redis_url, [EchoManager(), EchoManager()], **FAST):
        await asyncio.to_thread(client.wait_rewards, keys, 30)
        verdict = await asyncio.to_thread(settle, sync_redis, ks, {k: v for j in jobs for k, v in j.expected.items()})
    # Then every key was scored, and the stream and its pending list are empty again
    assert verdict.clean, verdict.explain()
    assert sync_redis.xlen(ks.stream(0)) == 0
    assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0
    assert sync_redis.xlen(ks.done(0)) == len(jobs)
    client.close()


async def test_results_and_trajectories_expire_after_result_ttl(
    redis_url: str, sync_redis: SyncClient, ns: str
) -> None:
    spaces = {ttl: f"{ns}-ttl{ttl}" for ttl in (0, 2, 60)}
    clients = {ttl: RewardClient.from_url(redis_url, namespace=n) for ttl, n in spaces.items()}
    keys = {ttl: push(clients[ttl], make_trajectories(3, seed=4, max_outputs=3)) for ttl in spaces}
    try:
        for ttl, n in spaces.items():
            async with running_workers(n, redis_url, [EchoManager()], result_ttl=ttl, **FAST):
                await asyncio.to_thread(clients[ttl].wait_rewards, keys[ttl], 30)
                # read as soon as they are scored: the 2 s ones may be gone once the next workers ran
                # (on a loaded machine, starting and stopping those may take longer than that)
                ks = Keyspace(n)
                for k in keys[ttl]:
                    reward_ttl = sync_redis.ttl(ks.reward_key(k))
                    traj_ttl = sync_redis.ttl(ks.traj_key(k.rpartition("_")[0]))
                    if ttl == 0:
                        assert reward_ttl == -1 and traj_ttl == -1, "result_ttl=0 keeps results forever"
                    else:
                        assert 0 < reward_ttl <= ttl and 0 < traj_ttl <= ttl, (ttl, reward_ttl, traj_ttl)
        scored_at = time.monotonic()
        # the short-lived ones are gone once their TTL has passed; the others are still there
        await asyncio.sleep(max(0.0, 3.5 - (time.monotonic() - scored_at)))
        short = Keyspace(spaces[2])
        assert not any(sync_redis.exists(short.reward_key(k)) for k in keys[2])
        assert not sync_redis.keys(short.traj_prefix(0) + "*")
        assert all(clients[60].get_rewards(keys[60]).values())
        assert all(clients[0].get_rewards(keys[0]).values())
    finally:
        for c in clients.values():
            c.close()
        from tests.conftest import _delete_namespace

        for n in spaces.values():
            _delete_namespace(redis_url, n)
