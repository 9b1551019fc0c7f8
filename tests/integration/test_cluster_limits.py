"""Bounded results and trajectories on a real Redis Cluster (3 local masters, 6 shards).

Every script runs with a ``#!lua`` shebang here, so the cluster refuses any key outside the slot of
the declared keys: the staged results of a chunked commit, the kept records and the renames stay
in their trajectory's slot. A ``put_trajectory`` the cluster refuses half-way leaves nothing queued.
The fleet's rate limiter shares its buckets, hand-backs and slots through cluster clients.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from rewardq import RewardClient
from rewardq.errors import RedisOutOfMemory
from rewardq.queue.broker import StreamBroker
from rewardq.queue.connection import connect_async
from rewardq.queue.entries import Entry
from rewardq.queue.keys import Keyspace
from rewardq.reward.ratelimit import open_limiter
from tests.support.cluster import SHARDS, LocalCluster
from tests.support.helpers import SAMPLE, output, results_for, seconds_to_use_a_hand_back
from tests.support.sync_client import ClusterClient, connect_node

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("single_slot_scripts")]


async def test_chunked_commits_and_kept_records_stay_in_their_slot(
    redis_cluster: LocalCluster, rc: ClusterClient
) -> None:
    ns = f"cl-{uuid.uuid4().hex[:8]}"
    ks = Keyspace(ns, SHARDS)
    producer = RewardClient.from_url(redis_cluster.url, namespace=ns, shards=SHARDS)
    client = connect_async(redis_cluster.url)
    broker = StreamBroker(client, ks, worker="w", commit_bytes=5000, keep_records=60)
    try:
        await broker.ensure_groups()
        tids = [f"t{i}_s" for i in range(12)]
        for i in range(12):
            producer.put_trajectory(f"t{i}", "s", [output(2, 3, seed=j) for j in range(8)], SAMPLE)
        shards = {ks.shard_of(t) for t in tids}
        assert len(shards) > 2  # the trajectories spread over several shards and nodes
        for shard in shards:
            entries = await broker.read([shard], 1000, None)
            by_tid: dict[str, list[Entry]] = {}
            for e in entries:
                by_tid.setdefault(e.key.rpartition("_")[0], []).append(e)
            claimed = await broker.claim_whole([(shard, t, es) for t, es in by_tid.items()])
            assert all(claimed)
            # every trajectory's 8 results of ~1.5 kB take 3 chunked script calls of at most 5 kB
            got = await broker.commit_many([(shard, t, results_for(t, 8, 1500)) for t in by_tid])
            assert got == [True] * len(by_tid)
        for t in tids:
            shard = ks.shard_of(t)
            hashes = [rc.hgetall(ks.reward(shard, f"{t}_{i}")) for i in range(8)]
            assert [h[b"reward_score"] for h in hashes] == [repr(float(i)).encode() for i in range(8)]
            kept = rc.hkeys(ks.records(shard, t))
            assert len(kept) == 8 and 0 < rc.ttl(ks.records(shard, t)) <= 60
        assert not [k for k in rc.scan_iter(match=f"{ns}:*:staged:*")]
        assert sum(rc.xlen(ks.done(s)) for s in range(SHARDS)) == 12
    finally:
        await client.aclose()
        producer.close()


def test_a_put_trajectory_the_cluster_refuses_half_way_leaves_nothing_queued(
    redis_cluster: LocalCluster, rc: ClusterClient
) -> None:
    ns = f"cl-{uuid.uuid4().hex[:8]}"
    ks = Keyspace(ns, SHARDS)
    producer = RewardClient.from_url(redis_cluster.url, namespace=ns, shards=SHARDS)
    _ = producer.keyspace
    tid = "half_s"
    shard = ks.shard_of(tid)
    node = rc.get_node_from_key(ks.stream(shard))
    direct = connect_node(node.host, int(node.port))
    big = {"prompt_ids": np.arange(1, 750_000, dtype=np.int32), "response_ids": [1, 2]}  # ~3 MB each
    try:
        used = int(direct.info("memory")["used_memory"])
        direct.config_set("maxmemory", used + 7 * 1024 * 1024)  # room for two of the five outputs
        direct.config_set("maxmemory-policy", "noeviction")
        with pytest.raises(RedisOutOfMemory) as err:
            producer.put_trajectory("half", "s", [big] * 5, SAMPLE)
        assert err.value.written is False and "nothing of it was written" in str(err.value)
        assert len(str(err.value)) < 1000
        assert rc.xlen(ks.stream(shard)) == 0  # the outputs added before the refusal were deleted again
    finally:
        direct.config_set("maxmemory", 0)
        direct.close()
    assert producer.put_trajectory("half", "s", [output(2, 3)] * 2, SAMPLE) == ["half_s_0", "half_s_1"]
    assert rc.xlen(ks.stream(shard)) == 2
    producer.close()


async def test_a_commit_past_maxmemory_on_its_node_is_refused_whole_then_waited_out(
    redis_cluster: LocalCluster, rc: ClusterClient
) -> None:
    import asyncio

    from rewardq.consumers.commits import CommitCoalescer
    from rewardq.consumers.metrics import NoMetrics
    from rewardq.consumers.retries import RoomWaits
    from rewardq.queue.connection import is_out_of_memory

    ns = f"cl-{uuid.uuid4().hex[:8]}"
    ks = Keyspace(ns, SHARDS)
    producer = RewardClient.from_url(redis_cluster.url, namespace=ns, shards=SHARDS)
    client = connect_async(redis_cluster.url)
    broker = StreamBroker(client, ks, worker="w")
    tid = "full_s"
    shard = ks.shard_of(tid)
    node = rc.get_node_from_key(ks.stream(shard))
    direct = connect_node(node.host, int(node.port))
    try:
        await broker.ensure_groups()
        keys = producer.put_trajectory("full", "s", [output(2, 3, seed=j) for j in range(3)], SAMPLE)
        entries = await broker.read([shard], 100, None)
        assert await broker.claim_whole([(shard, tid, entries)]) == [True]
        # Given the node holding the trajectory's slot past its maxmemory
        used = int(direct.info("memory")["used_memory"])
        direct.config_set("maxmemory-policy", "noeviction")
        direct.config_set("maxmemory", used - 1024 * 1024)
        # When the commit script is sent, it is refused whole (its flags), and nothing is written
        with pytest.raises(Exception) as err:
            await broker.commit(shard, tid, results_for(tid, 3, 100))
        assert is_out_of_memory(err.value), err.value
        assert [rc.exists(ks.reward_key(k)) for k in keys] == [0, 0, 0]
        # And a lease renewal still goes through there (allow-oom)
        assert await broker.liveness.renew({shard: [tid]}) == 1
        # When the worker's commit waits for room and the node gets some a moment later
        stats: dict[str, int] = {}
        coalescer = CommitCoalescer(broker, RoomWaits(metrics=NoMetrics(), stats=stats, base=0.02, cap=0.1))
        waiting = asyncio.create_task(coalescer.commit(shard, tid, results_for(tid, 3, 100)))
        await asyncio.sleep(0.5)
        assert not waiting.done() and stats["redis_full"] >= 2
        direct.config_set("maxmemory", 0)
        # Then the commit goes through: every key has its result
        assert await asyncio.wait_for(waiting, 10) is True
        assert [float(rc.hget(ks.reward_key(k), "reward_score") or -1) for k in keys] == [0.0, 1.0, 2.0]
    finally:
        direct.config_set("maxmemory", 0)
        direct.close()
        await client.aclose()
        producer.close()


async def test_the_fleet_rate_limiter_on_the_cluster_shares_hand_backs_and_slots(
    redis_cluster: LocalCluster, rc: ClusterClient
) -> None:
    # Given two processes' limiters (a cluster client each) naming one limiter: a bucket of 10 tokens
    # refilled at 10/s, and one concurrency slot
    key = Keyspace(f"rl-{uuid.uuid4().hex[:8]}").ratelimit("judge")
    a, b = (open_limiter(redis_cluster.url, key, cluster=True, max_tpm=600, max_concurrent=1) for _ in range(2))
    try:
        # When one reserves 50 tokens (the refill alone then needs 5 s for 10 more) and hands them back
        # Then the other process's waiter found them well before the refill would have
        assert await seconds_to_use_a_hand_back(a, b) < 0.3 * 5.0
        # And a hand-back is credited whole, up to two seconds of the rate, past the one-second refill
        assert await a.charge_tokens(-100) == pytest.approx(20.0)
        # And one slot is shared: the second holder waits until the first releases
        async with a.slot():
            assert await b._slot_op("slot", "probe") > 0
        async with b.slot():
            pass
    finally:
        await a.close()
        await b.close()
        rc.delete(key)
