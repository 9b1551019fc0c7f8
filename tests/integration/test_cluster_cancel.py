"""Cancellation and the shared judge cache on a real Redis Cluster (3 local masters, 6 shards), every
script with a ``#!lua`` shebang so the cluster refuses any key outside the declared keys' slot:
``cancel`` stays in its trajectory's slot, a worker's look at what it holds spans every shard, and
the shared cache's answers, index and evictions stay in their model's slot."""

from __future__ import annotations

import uuid

import pytest

from rewardq import RewardClient
from rewardq.producers.aio import AsyncRewardClient
from rewardq.queue.cancels import CancelWatch
from rewardq.queue.connection import connect_async
from rewardq.queue.keys import Keyspace
from rewardq.reward.judge.cache import JudgeCache
from rewardq.reward.judge.shared import SharedSpace, clear_shared, shared_models
from tests.support.cluster import SHARDS, LocalCluster
from tests.support.records import text_output
from tests.support.sync_client import ClusterClient

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("single_slot_scripts")]

SAMPLE = {"data_source": "judged", "reward_model": {"ground_truth": "42"}}


async def test_cancel_and_the_workers_look_span_the_shards(redis_cluster: LocalCluster, rc: ClusterClient) -> None:
    ns = f"cl-{uuid.uuid4().hex[:8]}"
    ks = Keyspace(ns, SHARDS)
    producer = RewardClient.from_url(redis_cluster.url, namespace=ns, shards=SHARDS)
    aproducer = AsyncRewardClient.from_url(redis_cluster.url, namespace=ns, shards=SHARDS)
    client = connect_async(redis_cluster.url)
    try:
        keys = [producer.put_trajectory(f"t{i}", "s", [text_output("a"), text_output("b")], SAMPLE) for i in range(12)]
        assert len({ks.shard_of(f"t{i}_s") for i in range(12)}) > 2
        watch = CancelWatch(client, ks)
        held: dict[int, list[str]] = {}
        for i in range(12):
            held.setdefault(ks.shard_of(f"t{i}_s"), []).append(f"t{i}_s")
        assert await watch.cancelled(held) == []  # nothing cancelled yet: one GET
        # cancelled by the blocking client and the asyncio one, over every shard
        assert producer.cancel([k for ks_ in keys[:6] for k in ks_]) == 12
        assert await aproducer.cancel([k for ks_ in keys[6:9] for k in ks_]) == 6
        got = producer.get_rewards([k for ks_ in keys for k in ks_])
        assert [r.status if r else None for r in got.values()] == ["cancelled"] * 18 + [None] * 6
        assert sorted(await watch.cancelled(held)) == sorted(f"t{i}_s" for i in range(9))
        assert await watch.cancelled(held) == []  # seen already
    finally:
        producer.close()
        await aproducer.aclose()
        await client.aclose()
        for k in list(rc.scan_iter(match=f"{ns}:*", count=1000)):
            rc.delete(k)


async def test_the_shared_cache_stays_in_its_models_slot(redis_cluster: LocalCluster, rc: ClusterClient) -> None:
    model = f"judge-{uuid.uuid4().hex[:8]}"
    client = connect_async(redis_cluster.url)
    space = SharedSpace(model, "v1", ttl=60.0, max_entries=2)
    cache = JudgeCache(client, Keyspace("cl-shared"), ttl=5.0, shared=space)
    try:
        for i in range(4):
            async with cache.claim(f"d{i}") as c:
                await c.put(f'{{"contents": ["Score: {i}"]}}')
        async with cache.claim("d3") as hit:
            assert hit.hit
        assert shared_models(rc, model)[0]["entries"] == 2
        assert clear_shared(rc, model) == {model: 2}
    finally:
        clear_shared(rc, model)
        await client.aclose()
