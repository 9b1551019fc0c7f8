"""Which ``--namespace`` a replay may run in, decided on a real Redis Cluster (3 local masters, 6 shards):
the replay's mark (``<ns>:replay``) and the traces of another pipeline are read key by key, so the
check spans every shard of a fleet's namespace."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from rewardq import RewardClient
from rewardq.consumers.compose import refuse_replays_namespace
from rewardq.errors import ConfigError
from rewardq.ledger.replay import Trajectory
from rewardq.queue.connection import connect_async
from rewardq.queue.keys import Keyspace
from rewardq.queue.namespace import ReplayMark
from rewardq.replay.namespace import check_namespace, mark_namespace, replay_mark
from tests.support.cluster import SHARDS, LocalCluster
from tests.support.helpers import output, worker_config
from tests.support.sync_client import ClusterClient

pytestmark = pytest.mark.cluster

SAMPLE = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "42"}}


def test_a_replay_runs_only_in_an_unused_namespace_or_one_with_its_own_mark(
    redis_cluster: LocalCluster, rc: ClusterClient
) -> None:
    ns = f"cl-replay-{uuid.uuid4().hex[:8]}"
    cfg = worker_config(ns, redis_cluster.url, cluster=True)
    trajs = [Trajectory(f"t{i}", "s", [output(3, 3, seed=i)], SAMPLE) for i in range(8)]
    mine, other = replay_mark("out-1", "fp-1"), replay_mark("out-2", "fp-1")
    try:
        # an unused namespace is taken, and then carries the replay's mark
        mark_namespace(cfg, mine, resuming=check_namespace(cfg, trajs, mine))
        assert ReplayMark.decode(rc.get(f"{ns}:replay")) == mine
        # whatever the replay leaves there, a replay with the same mark runs there again; no other does
        producer = RewardClient.from_url(redis_cluster.url, namespace=ns, shards=SHARDS)
        for t in trajs:
            producer.put_trajectory(t.uid, t.session_id, t.outputs, t.sample)
        producer.close()
        assert check_namespace(cfg, trajs, mine)  # a resume
        # a worker starts there only as the replay's own (the one that carries its mark)
        asyncio.run(_worker_check(redis_cluster.url, ns, mine))
        with pytest.raises(ConfigError, match=rf"held by `rewardq replay` .* redis-cli -c DEL {ns}:replay$"):
            asyncio.run(_worker_check(redis_cluster.url, ns, None))
        with pytest.raises(ConfigError, match="another --out"):
            check_namespace(cfg, trajs, other)
        with pytest.raises(ConfigError, match="marked by another replay"):
            mark_namespace(cfg, other, resuming=False)
    finally:
        for key in rc.scan_iter(match=f"{ns}:*"):
            rc.delete(key)


def test_a_fleets_namespace_is_refused_by_what_it_holds_on_any_shard(
    redis_cluster: LocalCluster, rc: ClusterClient
) -> None:
    ns = f"cl-fleet-{uuid.uuid4().hex[:8]}"
    cfg = worker_config(ns, redis_cluster.url, cluster=True)
    producer = RewardClient.from_url(redis_cluster.url, namespace=ns, shards=SHARDS)
    try:
        producer.put_trajectory("fleet", "s", [output(3, 3, seed=1)], SAMPLE)  # one shard of six: not shard 0
        assert producer.keyspace.shard_of("fleet_s") != 0
        mine = replay_mark("out-1", "fp-1")
        with pytest.raises(ConfigError, match="already holds its meta .*, stream entries or a consumer group"):
            check_namespace(cfg, [Trajectory("r", "s", [output(3, 3, seed=2)], SAMPLE)], mine)
        assert rc.get(f"{ns}:replay") is None
    finally:
        producer.close()
        for key in rc.scan_iter(match=f"{ns}:*"):
            rc.delete(key)


async def _worker_check(url: str, ns: str, own: ReplayMark | None) -> None:
    """What a worker of namespace ``ns`` checks at start, as the replay's own (``own``: its mark) or not."""
    r = connect_async(url, cluster=True)
    try:
        await refuse_replays_namespace(r, Keyspace(ns), own, cluster=True)
    finally:
        await r.aclose()
