"""Shared fixtures for tests/unit and tests/integration; shared helpers live in tests/support.

Integration tests use the real Redis at REWARDQ_TEST_REDIS_URL (default
redis://127.0.0.1:6379/0), each in its own namespace, and delete only their keys.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from rewardq.queue import scripts
from rewardq.reward.managers.naive import NaiveRewardManager
from tests.support.cli_procs import Procs
from tests.support.cluster import ClusterStartError, LocalCluster
from tests.support.managers import LengthManager
from tests.support.sync_client import SyncClient, connect

T = TypeVar("T")

REDIS_URL = os.environ.get("REWARDQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _delete_namespace(url: str, ns: str) -> None:
    r = redis.Redis.from_url(url)
    try:
        for pattern in (f"{ns}:*",):
            batch = []
            for k in r.scan_iter(match=pattern, count=1000):
                batch.append(k)
                if len(batch) >= 500:
                    r.delete(*batch)
                    batch = []
            if batch:
                r.delete(*batch)
    finally:
        r.close()


@pytest.fixture(scope="session")
def redis_url() -> str:
    r = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        r.ping()
    except redis.ConnectionError as exc:  # fail, never skip: the real server is part of the contract
        pytest.fail(f"Redis is not reachable at {REDIS_URL} ({exc}); start it with `redis-server --daemonize yes`")
    finally:
        r.close()
    return REDIS_URL


@pytest.fixture
def ns(redis_url: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield name
    _delete_namespace(redis_url, name)


@pytest.fixture
def sync_redis(redis_url: str) -> Iterator[SyncClient]:
    r = connect(redis_url)
    yield r
    r.close()


@pytest.fixture
def length_manager() -> LengthManager:
    LengthManager.calls = []
    return LengthManager(None)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.get_event_loop().run_until_complete(coro)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """CLI processes started by a test (``tests.support.cli_procs.Procs``), killed after it."""
    p = Procs(tmp_path)
    yield p
    p.kill_all()


@pytest.fixture
async def naive() -> AsyncIterator[Callable[..., NaiveRewardManager]]:
    """``make(fn, **settings)``: a naive manager over ``fn`` with those ScoringSettings, closed after the test."""
    from rewardq.reward.base import ManagerContext, ScoreFn
    from rewardq.reward.execution.settings import ScoringSettings
    from rewardq.reward.managers.naive import NaiveRewardManager
    from tests.support.records import TOK

    made: list[NaiveRewardManager] = []

    def make(fn: ScoreFn, **settings: Any) -> NaiveRewardManager:
        m = NaiveRewardManager(TOK, fn, context=ManagerContext(scoring=ScoringSettings(**settings)))
        made.append(m)
        return m

    yield make
    for m in made:
        await m.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A fresh 3-master cluster for the session; fails (never skips) when it cannot start."""
    try:
        cluster = LocalCluster().start()
    except ClusterStartError as exc:
        pytest.fail(f"could not start the local Redis Cluster:\n{exc}")
    print(f"\n[cluster] 3 masters on ports {cluster.ports} ready in {cluster.startup_seconds:.2f}s")
    yield cluster
    cluster.stop()


@pytest.fixture
def single_slot_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every rewardq script with a ``#!lua`` shebang (and no flags) in the tests that use it.

    Scripts without a shebang may touch any key of the node they run on (Redis keeps that
    for old scripts); with it, the cluster refuses any key outside the slot of the declared
    keys, including the keys a script builds from a prefix. So every script that runs here
    is proven to stay in one slot.
    """
    plain = scripts.source
    monkeypatch.setattr(scripts, "source", lambda name: "#!lua\n" + plain(name))
