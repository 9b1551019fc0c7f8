"""Recovery on a real Redis Cluster (3 local masters, 6 shards): an abandoned trajectory reclaimed and
a stopped worker's handed back on their shards, blobs on their shards, and dead letters and
incomplete trajectories ended on the shard their entries were read from.

The cluster, and what the cluster tests share, are :mod:`tests.support.cluster`'s and
``tests/conftest.py``'s (``redis_cluster``, ``rc``, ``cns``, ``single_slot_scripts``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from tests.support.cluster import SHARDS, LocalCluster, assert_drained, uid_on_shard
from tests.support.helpers import (
    SAMPLE,
    Hang,
    open_test_worker,
    output,
    running_workers,
    stop_while_scoring,
    until,
    worker_config,
)
from tests.support.helpers import abandon_worker as _abandon
from tests.support.managers import GatedLengthManager, LengthManager
from tests.support.sync_client import ClusterClient

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("single_slot_scripts")]


@pytest.fixture
def ks(cns: str) -> Keyspace:
    return Keyspace(cns, SHARDS)


@pytest.fixture
def client(redis_cluster: LocalCluster, cns: str) -> Iterator[RewardClient]:
    """The producer of the test's namespace."""
    c = RewardClient.from_url(redis_cluster.url, namespace=cns, shards=SHARDS)
    yield c
    c.close()


# ---------------------------------------------------------------------------------------------
# (a) crash recovery and hand-back
# ---------------------------------------------------------------------------------------------
async def test_abandoned_trajectory_is_reclaimed_on_its_cluster_shard(
    redis_cluster: LocalCluster, cns: str, rc: ClusterClient, ks: Keyspace, client: RewardClient
) -> None:
    url = redis_cluster.url
    shard = SHARDS - 1  # on the last master, never the node the URL names
    uid = uid_on_shard(ks, shard, "crash")
    keys = client.put_trajectory(uid, "s", [output(3, 4), output(3, 6), output(2, 9)], SAMPLE)
    # Given worker A took the trajectory, renewed its lease (renew.lua) and then died mid-scoring
    a = await open_test_worker(worker_config(cns, url, name="A", shards=SHARDS), manager=Hang(None))
    await a.handle(await a.broker.read([shard], 10, None))
    assert list(a.in_flight) == [f"{uid}_s"]
    assert await a.broker.liveness.renew(a.flights.held()) == 1
    await _abandon(a)
    # (all three outputs came in one read: the trajectory was claimed whole, its entries stay pending)
    assert rc.xpending(ks.stream(shard), ks.group)["pending"] == 3
    # When another worker runs, it reclaims the idle entry once the lease has run out
    LengthManager.calls = []
    async with running_workers(cns, url, [LengthManager(None)], shards=SHARDS, max_deliveries=10) as (b,):
        res = await asyncio.to_thread(client.wait_rewards, keys, 20)
        reclaimed = b.stats["reclaimed"]
    # Then it is scored once, by the survivor, and nothing is left pending
    assert [r.reward_score for r in res.values()] == [9.0, 9.0, 9.0]
    assert {r.worker for r in res.values()} == {"w0"}
    assert reclaimed >= 1 and len(LengthManager.calls) == 1
    assert rc.xlen(ks.done(shard)) == 1
    assert_drained(rc, ks)


async def test_large_records_travel_as_blobs_on_their_cluster_shards(
    redis_cluster: LocalCluster, cns: str, rc: ClusterClient, ks: Keyspace, client: RewardClient
) -> None:
    url = redis_cluster.url
    # Given a trajectory on the last master whose first output (~3.2 MB) travels as a blob, put one
    # output at a time, and one put whole
    uid, whole = uid_on_shard(ks, SHARDS - 1, "big"), uid_on_shard(ks, 1, "whole")
    keys = [
        client.put_output(uid, "s", 0, output(800_000, 3), SAMPLE),
        client.put_output(uid, "s", 1, output(3, 5), SAMPLE, final=True),
        *client.put_trajectory(whole, "s", [output(800_000, 2, seed=1), output(3, 7)], SAMPLE),
    ]
    blobs = [f[b"blob"] for s in (1, SHARDS - 1) for _, f in rc.xrange(ks.stream(s)) if b"blob" in f]
    assert len(blobs) == 2 and all(rc.exists(b) for b in blobs)
    # When a worker scores them (its scripts name each blob on the blob's own shard's slot)
    async with running_workers(cns, url, [LengthManager(None)], shards=SHARDS):
        res = await asyncio.to_thread(client.wait_rewards, keys, 30)
    # Then both are scored with all their rows, and no blob or entry is left
    assert [r.reward_score for r in res.values()] == [5.0, 5.0, 7.0, 7.0]
    assert not any(rc.exists(b) for b in blobs)
    assert_drained(rc, ks)


async def test_a_duplicate_blob_listed_in_acks_is_deleted_on_its_cluster_shard(
    redis_cluster: LocalCluster, cns: str, rc: ClusterClient, ks: Keyspace, client: RewardClient
) -> None:
    url = redis_cluster.url
    GatedLengthManager.opened, GatedLengthManager.fail = asyncio.Event(), False
    uid, big = uid_on_shard(ks, SHARDS - 1, "dup"), output(800_000, 3)
    async with running_workers(cns, url, [GatedLengthManager(None)], shards=SHARDS) as (w,):
        # Given a trajectory of a large output and a small final one, being scored on the last master
        keys = [
            client.put_output(uid, "s", 0, big, SAMPLE),
            client.put_output(uid, "s", 1, output(3, 5), SAMPLE, final=True),
        ]
        await until(lambda: w.in_flight, "the worker to score the trajectory", 30)
        # When the large output is put again, and the duplicate's entry is listed in `acks`
        client.put_output(uid, "s", 0, big, SAMPLE)
        blobs = [f[b"blob"] for _, f in rc.xrange(ks.stream(SHARDS - 1)) if b"blob" in f]
        assert len(blobs) == 2 and all(rc.exists(b) for b in blobs)
        traj = ks.traj_key(f"{uid}_s")
        await until(lambda: (rc.hget(traj, "acks") or b"").count(b",") == 1, "the duplicate listed", 30)
        GatedLengthManager.opened.set()
        res = await asyncio.to_thread(client.wait_rewards, keys, 30)
    # Then the trajectory is scored, and the script that ended it deleted both blobs in their slot
    assert [r.reward_score for r in res.values()] == [5.0, 5.0]
    assert not any(rc.exists(b) for b in blobs)
    assert_drained(rc, ks)


async def test_graceful_stop_hands_back_on_the_cluster(
    redis_cluster: LocalCluster, cns: str, rc: ClusterClient, ks: Keyspace, client: RewardClient
) -> None:
    url = redis_cluster.url
    uid = uid_on_shard(ks, 2, "hand")
    keys = client.put_trajectory(uid, "s", [output(2, 5)], SAMPLE)
    # Given a worker stopped while scoring (release.lua hands the trajectory back)
    await stop_while_scoring(worker_config(cns, url, name="A", shards=SHARDS, shutdown_grace=0.2, claim_idle=30.0))
    assert not rc.hget(ks.traj_key(f"{uid}_s"), "lease")
    # Then the next worker picks it up at once, although claim_idle is 30 s
    async with running_workers(cns, url, [LengthManager(None)], shards=SHARDS, claim_idle=30.0):
        res = await asyncio.to_thread(client.wait_rewards, keys, 10)
    assert res[keys[0]].reward_score == 5.0
    assert_drained(rc, ks)


# ---------------------------------------------------------------------------------------------
# (b) dead letters and incomplete trajectories
# ---------------------------------------------------------------------------------------------
async def test_garbage_and_bad_records_are_dead_lettered_on_their_shards(
    redis_cluster: LocalCluster, cns: str, rc: ClusterClient, ks: Keyspace, client: RewardClient
) -> None:
    import msgpack

    from rewardq.queue.codec import encode_output

    url = redis_cluster.url
    good = client.put_trajectory(uid_on_shard(ks, 4, "good"), "s", [output(3, 5), output(4, 6)], SAMPLE)
    # Given a garbage entry on shard 4, a malformed record on its own shard (1) and one misrouted to shard 4
    garbage = b"\xc1\xff not msgpack"
    rc.xadd(ks.stream(4), {"key": "entry-garbage", "data": garbage, "ts": "0"})

    def bad(uid: str) -> bytes:
        rec = msgpack.unpackb(
            encode_output(uid, "s", 0, {"prompt_ids": [1], "response_ids": [2]}, SAMPLE, final=True),
            raw=False,
            ext_hook=lambda c, b: msgpack.ExtType(c, b),
        )
        rec["response_ids"] = "hello"
        packed: bytes = msgpack.packb(rec, use_bin_type=True)
        return packed

    own, misrouted = uid_on_shard(ks, 1, "own"), uid_on_shard(ks, 1, "mis")
    while misrouted == own:
        misrouted = uid_on_shard(ks, 1, misrouted + "x")
    rc.xadd(ks.stream(1), {"key": f"{own}_s_0", "data": bad(own), "ts": "0"})
    rc.xadd(ks.stream(4), {"key": f"{misrouted}_s_0", "data": bad(misrouted), "ts": "0"})
    # and a trajectory on shard 3 whose final output never arrives (expire.lua)
    lost = uid_on_shard(ks, 3, "lost")
    client.put_output(lost, "s", 0, output(2, 2), SAMPLE)
    async with running_workers(cns, url, [LengthManager(None)], shards=SHARDS, incomplete_timeout=1.0) as (w,):
        res = await asyncio.to_thread(client.wait_rewards, good + [f"{own}_s_0", f"{misrouted}_s_0", f"{lost}_s_0"], 15)
        for _ in range(50):
            if w.stats["dead_letters"] >= 3:
                break
            await asyncio.sleep(0.1)
    # Then the good trajectory is scored and every bad key has an error result
    assert [res[k].reward_score for k in good] == [6.0, 6.0]
    assert "response_ids" in (res[f"{own}_s_0"].error or "") and "response_ids" in (res[f"{misrouted}_s_0"].error or "")
    assert "final output never arrived" in (res[f"{lost}_s_0"].error or "")
    # And the dead letters sit on the shard the entry was read from, raw data kept
    dead4 = {f[b"key"]: f for _, f in rc.xrange(ks.dead(4))}
    assert set(dead4) == {b"entry-garbage", f"{misrouted}_s_0".encode()}
    assert dead4[b"entry-garbage"][b"kind"] == b"invalid" and dead4[b"entry-garbage"][b"data"] == garbage
    assert b"not a valid msgpack record" in dead4[b"entry-garbage"][b"reason"]
    (dead1,) = [f for _, f in rc.xrange(ks.dead(1))]
    assert dead1[b"key"] == f"{own}_s_0".encode() and dead1[b"kind"] == b"invalid"
    (dead3,) = [f for _, f in rc.xrange(ks.dead(3))]
    assert dead3[b"kind"] == b"incomplete" and dead3[b"tid"] == f"{lost}_s".encode()
    assert_drained(rc, ks)
