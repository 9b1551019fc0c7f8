"""Transient failures are retried in place: real Redis, in-process workers, a judge that is down.

A trajectory whose scoring fails for a ``transient`` reason waits (holding no scoring slot, its
lease renewed), is scored again after a pause honouring ``Retry-After``, and becomes an error
result of kind ``transient`` only once ``retry_for`` runs out. Trajectories of other data
sources keep flowing meanwhile, and a worker that stops during a wait hands its trajectory back.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

import pytest

from rewardq import FailureKind, RewardClient
from rewardq.queue.keys import Keyspace
from tests.support.helpers import output, running_workers, until
from tests.support.managers import OutageManager
from tests.support.sync_client import connect


def sample(data_source: str, uid: str) -> dict[str, Any]:
    return {"data_source": data_source, "reward_model": {"ground_truth": "x"}, "extra_info": {"uid": uid}}


@pytest.fixture
def judge() -> type[OutageManager]:
    OutageManager.calls = []
    OutageManager.retry_after = 0.3
    OutageManager.down_until = 0.0
    return OutageManager


def put(client: RewardClient, uid: str, data_source: str = "judge", n: int = 2) -> list[str]:
    return client.put_trajectory(uid, "s", [output(2, 3 + i) for i in range(n)], sample(data_source, uid))


async def test_an_outage_is_ridden_out_and_other_trajectories_keep_flowing(
    ns: str, redis_url: str, judge: type[OutageManager]
) -> None:
    # Given a judge that answers 503 (Retry-After 0.3 s) for the next 2.5 s, and a worker of
    # concurrency 2 with a retry window far longer than the outage
    client = RewardClient.from_url(redis_url, namespace=ns)
    judge.down_until = time.time() + 2.5
    judged = [put(client, f"j{i}") for i in range(6)]
    # When trajectories of the judge and of another data source arrive together
    async with running_workers(ns, redis_url, [judge(None)], concurrency=2, retry_for=60) as (w,):
        others = [put(client, f"m{i}", "math") for i in range(6)]
        other_results = await asyncio.to_thread(client.wait_rewards, [k for t in others for k in t], 10)
        others_done = time.time()
        # (while they wait, the judged trajectories are held by the worker, leased, resting)
        await until(lambda: len(w.flights.resting) >= 2, "trajectories resting on a retry")
        snap = w.snapshot()
        results = await asyncio.to_thread(client.wait_rewards, [k for t in judged for k in t], 30)
    # Then every judged key is the recovered judge's reward: no error result at all
    assert {(r.status, r.reward_score, r.failure_kind) for r in results.values()} == {("ok", 1.0, None)}
    # And the other data source was scored during the outage, though concurrency was 2
    assert {r.reward_score for r in other_results.values()} == {0.5} and others_done < judge.down_until
    # And each judged trajectory's tries were at least Retry-After apart, at most Retry-After * 1.5 + slack
    by_uid: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for t, uid, ok in judge.calls:
        by_uid[uid].append((t, ok))
    assert set(by_uid) == {f"j{i}" for i in range(6)}
    for uid, tries in by_uid.items():
        assert tries[-1][1] and not any(ok for _, ok in tries[:-1]), (uid, tries)
        gaps = [b[0] - a[0] for a, b in zip(tries, tries[1:])]
        assert gaps and all(gap >= 0.3 for gap in gaps), (uid, gaps)
    # And the heartbeat said what waited and why
    import json

    waiting = json.loads(snap["retrying"])
    assert waiting["n"] >= 2 and all("HTTP 503" in w_["reason"] for w_ in waiting["waiting"])
    assert int(snap["retries"]) >= 2
    client.close()


async def test_a_trajectory_waiting_on_a_retry_keeps_its_lease(
    ns: str, redis_url: str, judge: type[OutageManager]
) -> None:
    # Given a judge down for longer than two lease periods (lease_seconds=2 in the test settings)
    client = RewardClient.from_url(redis_url, namespace=ns)
    r = connect(redis_url)
    ks = Keyspace(ns)
    judge.down_until = time.time() + 5.0
    judge.retry_after = 1.0
    keys = put(client, "long")
    async with running_workers(ns, redis_url, [judge(None)], retry_for=60) as (w,):
        await until(lambda: w.flights.resting, "the trajectory to rest", 5.0)
        seen = set()
        for _ in range(8):  # while it waits, its lease stays the worker's and keeps being renewed
            lease, lease_until = r.hmget(ks.traj(0, "long_s"), ["lease", "lease_until"])
            assert lease is not None and lease.decode() == w.name
            seen.add(lease_until)
            await asyncio.sleep(0.5)
        results = await asyncio.to_thread(client.wait_rewards, keys, 20)
        assert w.stats["reclaimed"] == 0
    assert len(seen) >= 3
    assert {(x.status, x.reward_score) for x in results.values()} == {("ok", 1.0)}
    r.close()
    client.close()


async def test_the_window_runs_out_into_a_transient_error(ns: str, redis_url: str, judge: type[OutageManager]) -> None:
    # Given a judge that never comes back, a 2 s window, and no Retry-After (the backoff decides)
    client = RewardClient.from_url(redis_url, namespace=ns)
    judge.down_until = time.time() + 3600
    judge.retry_after = None
    t0 = time.time()
    keys = put(client, "dead")
    async with running_workers(ns, redis_url, [judge(None)], retry_for=2.0):
        results = await asyncio.to_thread(client.wait_rewards, keys, 20)
    # Then it ends as a transient error naming the tries, once the window is spent
    for x in results.values():
        assert x.status == "error" and x.failure_kind is FailureKind.TRANSIENT, x
        assert "TransientError: the judge answered HTTP 503" in (x.error or "")
        assert "retry_for=2s ran out" in (x.error or "")
    assert time.time() - t0 >= 2.0
    assert len(judge.calls) >= 2  # tried again at least once (1 s, then a last try as the window closes)
    client.close()


async def test_a_retry_after_past_the_window_fails_at_once(ns: str, redis_url: str, judge: type[OutageManager]) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    judge.down_until = time.time() + 3600
    judge.retry_after = 120.0
    keys = put(client, "later")
    async with running_workers(ns, redis_url, [judge(None)], retry_for=30.0):
        results = await asyncio.to_thread(client.wait_rewards, keys, 10)
    (x, _) = results.values()
    assert x.failure_kind is FailureKind.TRANSIENT and len(judge.calls) == 1
    assert "the server asked to retry after 120s, later than the 30.0s left; retry_for=30s ran out" in (x.error or "")
    client.close()


async def test_retry_for_zero_never_retries(ns: str, redis_url: str, judge: type[OutageManager]) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    judge.down_until = time.time() + 3600
    keys = put(client, "now")
    async with running_workers(ns, redis_url, [judge(None)], retry_for=0):
        results = await asyncio.to_thread(client.wait_rewards, keys, 10)
    assert {x.failure_kind for x in results.values()} == {FailureKind.TRANSIENT} and len(judge.calls) == 1
    assert all("(not retried: retry_for=0)" in (x.error or "") for x in results.values())
    client.close()


async def test_a_worker_stopping_during_a_wait_hands_the_trajectory_back(
    ns: str, redis_url: str, judge: type[OutageManager]
) -> None:
    # Given a worker holding a trajectory that waits 30 s on a retry
    client = RewardClient.from_url(redis_url, namespace=ns)
    r = connect(redis_url)
    ks = Keyspace(ns)
    judge.down_until = time.time() + 3600
    judge.retry_after = 30.0
    keys = put(client, "moved")
    async with running_workers(ns, redis_url, [judge(None)], retry_for=300, name_prefix="first") as (w,):
        await until(lambda: w.flights.resting, "the trajectory to rest", 5.0)
        since = float(r.hget(ks.traj(0, "moved_s"), "retry_since") or 0)
        t_stop = time.monotonic()
    # When it stops: at once, not after the wait or the shutdown grace
    assert time.monotonic() - t_stop < 3.0
    assert r.hget(ks.traj(0, "moved_s"), "lease") is None and int(r.hget(ks.traj(0, "moved_s"), "handbacks") or 0) == 1
    # Then another worker takes it over at once and scores it when the judge is back, its window kept
    judge.down_until = 0.0
    async with running_workers(ns, redis_url, [judge(None)], retry_for=300, name_prefix="second"):
        results = await asyncio.to_thread(client.wait_rewards, keys, 15)
    assert {(x.status, x.reward_score, x.worker) for x in results.values()} == {("ok", 1.0, "second0")}
    assert since > 0 and float(r.hget(ks.traj(0, "moved_s"), "retry_since") or 0) == since
    r.close()
    client.close()
