"""``tests.support.exactly_once`` counts pending entries, or raises: never a silent zero.

Given real streams on the real Redis: a stream that does not exist has nothing pending, a
group's delivered and unacknowledged entries are counted, and a stream whose group is missing,
or a Redis that does not answer, raises instead of reporting "nothing pending".
"""

from __future__ import annotations

import pytest
import redis

from rewardq.queue.keys import Keyspace
from tests.support.exactly_once import leftovers, pending
from tests.support.sync_client import SyncClient


def test_pending_counts_what_the_group_holds(sync_redis: SyncClient, ns: str) -> None:
    ks = Keyspace(ns, 2)
    assert pending(sync_redis, ks, 0) == 0  # no stream at all: nothing was ever delivered
    sync_redis.xgroup_create(ks.stream(0), ks.group, id="0", mkstream=True)
    for i in range(3):
        sync_redis.xadd(ks.stream(0), {"key": f"u{i}_s_0"})
    delivered = sync_redis.xreadgroup(ks.group, "c1", {ks.stream(0): ">"}, count=2)
    assert pending(sync_redis, ks, 0) == 2
    sync_redis.xack(ks.stream(0), ks.group, delivered[0][1][0][0])
    assert pending(sync_redis, ks, 0) == 1
    assert leftovers(sync_redis, ks) == {"stream": 3, "pending": 1, "waiting": 0, "dead": 0}


def test_a_stream_without_its_group_raises(sync_redis: SyncClient, ns: str) -> None:
    ks = Keyspace(ns)
    sync_redis.xadd(ks.stream(0), {"key": "u_s_0"})
    with pytest.raises(AssertionError, match="has no consumer group"):
        leftovers(sync_redis, ks)


def test_an_unreachable_redis_raises() -> None:
    r = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    with pytest.raises(redis.ConnectionError):
        leftovers(r, Keyspace("nowhere"))
