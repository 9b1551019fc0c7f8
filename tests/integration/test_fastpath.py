"""The whole-trajectory fast path (lua/claim.lua): one script per trajectory, records left
in the stream, and every guarantee of the slow path kept."""

from __future__ import annotations

import asyncio

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from tests.support.checks import must
from tests.support.helpers import SAMPLE, Hang, open_test_worker, output, running_workers, worker_config
from tests.support.helpers import abandon_worker as _abandon
from tests.support.managers import LengthManager
from tests.support.sync_client import SyncClient


async def test_whole_trajectory_is_claimed_without_copying_records(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    client.put_trajectory("fast", "s", [output(3, 4), output(3, 5), output(3, 6)], SAMPLE)
    w = await open_test_worker(worker_config(ns, redis_url, name="A"), manager=Hang(None))
    try:
        await w.handle(await w.broker.read([0], 10, None))
        h = {k.decode(): v for k, v in sync_redis.hgetall(ks.traj_key("fast_s")).items()}
        assert h["lease"] == b"A" and h["final"] == b"2" and len(h["whole"].split(b",")) == 3
        assert not [k for k in h if k.startswith("o:")]  # nothing copied into the hash
        assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 3  # pending until the commit acks
        assert sync_redis.xlen(ks.stream(0)) == 3
    finally:
        await _abandon(w)
        client.close()


async def test_late_duplicates_of_a_whole_trajectory(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    same = client.put_trajectory("same", "s", [output(3, 4, seed=1), output(3, 5, seed=2)], SAMPLE)
    client.put_trajectory("diff", "s", [output(3, 4, seed=1), output(3, 5, seed=2)], SAMPLE)
    a = await open_test_worker(worker_config(ns, redis_url, name="A"), manager=Hang(None))
    await a.handle(await a.broker.read([0], 10, None))  # both claimed whole by A, which then dies
    await _abandon(a)
    client.put_output("same", "s", 1, output(3, 5, seed=2), SAMPLE, final=True)  # identical: harmless
    client.put_output("diff", "s", 0, output(3, 4, seed=9), SAMPLE)  # same key, other content
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        res = await asyncio.to_thread(client.wait_rewards, same + ["diff_s_0", "diff_s_1"], 15)
    assert [res[k].reward_score for k in same] == [5.0, 5.0]
    assert "two different records for key diff_s_0" in (res["diff_s_0"].error or "")
    assert res["diff_s_1"].status == "error"
    assert sync_redis.xlen(ks.stream(0)) == 0 and sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0
    client.close()


async def test_a_whole_duplicate_of_a_finished_trajectory_rewrites_nothing(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    """A whole trajectory whose claim finds it already finished goes through ``store``, which
    acknowledges the duplicate and rewrites nothing."""
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = client.put_trajectory("dup", "s", [output(3, 4), output(3, 5)], SAMPLE)
    LengthManager.calls = []
    w = await open_test_worker(worker_config(ns, redis_url, name="A"), manager=LengthManager(None))
    try:
        await w.handle(await w.broker.read([0], 10, None))
        first = await asyncio.to_thread(client.wait_rewards, keys, 10)
        # the same trajectory again, whole in one read (a producer retried its put)
        client.put_trajectory("dup", "s", [output(3, 4), output(3, 5)], SAMPLE)
        await w.handle(await w.broker.read([0], 10, None))
        for _ in range(100):
            if not w.in_flight:
                break
            await asyncio.sleep(0.02)
        assert not w.in_flight
        again = client.get_rewards(keys)
        assert [must(r).scored_at for r in again.values()] == [must(r).scored_at for r in first.values()]
        assert [must(r).reward_score for r in again.values()] == [5.0, 5.0]
        assert w.stats["duplicates"] == 2 and w.stats["scored"] == 1 and w.stats["errors"] == 0
        assert sync_redis.xlen(ks.stream(0)) == 0 and sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0
        assert sync_redis.xlen(ks.done(0)) == 1  # finished once
    finally:
        await w.stop()
        client.close()


async def test_a_failed_claim_writes_nothing_and_leaves_the_entries_pending(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    client.put_trajectory("lost", "s", [output(3, 4), output(3, 5)], SAMPLE)
    w = await open_test_worker(worker_config(ns, redis_url, name="A"), manager=LengthManager(None))
    try:

        async def refused(groups: object) -> list[bool]:
            raise ConnectionError("redis went away mid-claim")

        real = w.broker.claim_whole
        w.broker.claim_whole = refused  # type: ignore[method-assign]  # a claim that fails
        entries = await w.broker.read([0], 10, None)
        try:
            await w.handle(entries)
            raise AssertionError("the claim's failure did not reach the reader")
        except ConnectionError:
            pass
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert not w.in_flight and w.stats["scored"] == 0
        assert not sync_redis.exists(ks.reward_key("lost_s_0"), ks.reward_key("lost_s_1"))
        assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 2  # for a reclaim to find
        w.broker.claim_whole = real  # type: ignore[method-assign]
    finally:
        await w.stop()
        client.close()


async def test_a_trajectory_a_read_cuts_short_is_held_back_for_the_next_read(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    """A read's trailing partial trajectory waits for the next read (no ``store``), where it is
    whole and claimed; held back when no read follows, it is filed by ``store`` as before."""
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    for tid in ("a", "b", "c"):
        client.put_trajectory(tid, "s", [output(3, 4), output(3, 5), output(3, 6)], SAMPLE)
    w = await open_test_worker(worker_config(ns, redis_url, name="A"), manager=Hang(None))
    try:
        held = await w.handle_read(await w.broker.read([0], 4, None), [], {0})  # a0 a1 a2 b0
        assert [(f[1].tid, f[1].index) for f in held] == [("b_s", 0)]
        assert not sync_redis.exists(ks.traj_key("b_s"))  # nothing filed for b yet
        held = await w.handle_read(await w.broker.read([0], 4, None), held, {0})  # b1 b2 c0 c1
        h = {k.decode(): v for k, v in sync_redis.hgetall(ks.traj_key("b_s")).items()}
        assert h["lease"] == b"A" and len(h["whole"].split(b",")) == 3  # claimed whole
        assert not [k for k in h if k.startswith("o:")]
        assert [(f[1].tid, f[1].index) for f in held] == [("c_s", 0), ("c_s", 1)]
        # no read follows (the reader found nothing, or has no room): c's records are stored
        assert await w.handle_read([], held, ()) == []
        c = {k.decode(): v for k, v in sync_redis.hgetall(ks.traj_key("c_s")).items()}
        assert "o:0" in c and "o:1" in c and "lease" not in c  # parked, waiting for output 2
        # a partial that does not end its read, or one redelivered, is never held back
        assert await w.handle_read(await w.broker.read([0], 4, None), [], {0}) == []  # c2: completes c
        assert sync_redis.hget(ks.traj_key("c_s"), "lease") == b"A"
        assert w.stats["parked"] == 2 and sorted(w.in_flight) == ["a_s", "b_s", "c_s"]
    finally:
        await _abandon(w)
        client.close()
