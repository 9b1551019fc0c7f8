"""Quarantine with in-process workers on the real Redis: the trajectories of a worker that died are
scored side by side; those in a scorer of a reclaimed attempt when their worker died again are
scored in cohorts, halved after each death in one; a graceful hand-back is not held against it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from tensordict import TensorDict

from rewardq import RewardClient
from rewardq.errors import TransientError
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RewardResult
from rewardq.reward.base import RewardManager
from rewardq.reward.rows import last_row, valid_response_ids
from tests.support.helpers import (
    SAMPLE,
    Hang,
    PeakCounter,
    abandon_worker,
    open_test_worker,
    output,
    running_workers,
    stop_while_scoring,
    until,
    worker_config,
)
from tests.support.sync_client import SyncClient


class Overlap(RewardManager):
    """Reward = final response length; ``at_once.peak`` is the most trajectories it scored at once."""

    at_once = PeakCounter()

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        with type(self).at_once:
            await asyncio.sleep(0.1)
            return {"reward_score": float(valid_response_ids(last_row(data)).shape[0]), "reward_extra_info": {}}


async def _dead_worker_with(ns: str, redis_url: str, name: str, client: RewardClient, tids: list[str]) -> list[str]:
    """Put one trajectory per id, have worker ``name`` take them all (its manager hangs), and let it die."""
    keys = [client.put_trajectory(tid, "0", [output(2, 3 + i)], SAMPLE)[0] for i, tid in enumerate(tids)]
    a = await open_test_worker(worker_config(ns, redis_url, name=name), manager=Hang(None))
    await a.handle(await a.broker.read([0], 10, None))
    assert len(a.in_flight) == len(tids)
    await abandon_worker(a)
    return keys


async def _scored_by_a_fresh_worker(
    ns: str, redis_url: str, client: RewardClient, keys: list[str]
) -> tuple[dict[str, RewardResult], int]:
    """``keys``' results once a fresh worker has scored them, and the most it scored at once."""
    Overlap.at_once = PeakCounter()
    async with running_workers(ns, redis_url, [Overlap(None)]):
        res = await asyncio.to_thread(client.wait_rewards, keys, 30)
    return res, Overlap.at_once.peak


async def test_trajectories_of_a_dead_worker_are_scored_side_by_side(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    # Given four trajectories in flight at a worker that dies
    keys = await _dead_worker_with(ns, redis_url, "A", client, [f"dead{i}" for i in range(4)])
    # When another worker takes them over
    res, at_once = await _scored_by_a_fresh_worker(ns, redis_url, client, keys)
    # Then each is scored, side by side (a death blames none of them), its start in the scorer counted
    assert [r.reward_score for r in res.values()] == [3.0, 4.0, 5.0, 6.0]
    assert at_once > 1
    for i in range(4):
        assert sync_redis.hmget(ks.traj(0, f"dead{i}_0"), "attempts", "shared", "solo") == [b"2", b"1", None]
    client.close()


async def _reclaim_and_die(ns: str, redis_url: str, name: str, started: Callable[[], bool]) -> None:
    """Worker ``name`` (its manager hangs) reclaims every trajectory, and dies (SIGKILL: nothing is
    taken back) once ``started`` says they are in its scorer."""
    w = await open_test_worker(worker_config(ns, redis_url, name=name), manager=Hang(None))
    deadline = time.monotonic() + 20
    while len(w.in_flight) < 4:  # its maintenance, run by hand: reclaim once the dead worker's leases end
        assert time.monotonic() < deadline, f"worker {name} did not reclaim all four"
        await w.maintain()
        await asyncio.sleep(0.2)
    await until(started, f"their starts in worker {name}'s scorer", 5.0)
    w.rounds.parts.quarantine.take_back = _nothing  # type: ignore[method-assign,assignment]  # a killed process runs no clean-up
    await abandon_worker(w)


async def test_trajectories_in_a_scorer_when_reclaiming_workers_die_are_bisected_in_cohorts(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    tids = [f"twice{i}_0" for i in range(4)]

    def fields(*names: str) -> list[list[bytes | None]]:
        return [sync_redis.hmget(ks.traj(0, t), *names) for t in tids]

    # Given four trajectories of a dead worker, reclaimed by a second one that dies with all four
    # in its scorer side by side
    keys = await _dead_worker_with(ns, redis_url, "A", client, [t[:-2] for t in tids])
    await _reclaim_and_die(ns, redis_url, "B", lambda: _all_started(sync_redis, ks, 4, "twice"))
    # When a third worker scores them as suspects (one cohort: they were never in one) and dies too
    await _reclaim_and_die(ns, redis_url, "C", lambda: fields("cohort", "width") == [[b"1", b"4"]] * 4)
    res, at_once = await _scored_by_a_fresh_worker(ns, redis_url, client, keys)
    # Then each is scored right, in cohorts of half the size of the one that died (two at once),
    # none alone: no solo start, so nothing is blamed on any of them
    assert [r.reward_score for r in res.values()] == [3.0, 4.0, 5.0, 6.0]
    assert at_once == 2
    assert fields("attempts", "shared", "cohort", "width", "solo") == [[b"4", b"1", b"2", b"2", None]] * 4
    client.close()


class Unavailable(RewardManager):
    """A judge that is always down (a transient failure: the trajectory rests before each retry)."""

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        raise TransientError("judge endpoint returned 503", retry_after=60)


async def test_trajectories_only_waiting_when_a_reclaiming_worker_dies_are_not_suspected(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    # Given four trajectories of a dead worker, reclaimed by a second one whose judge is down, so each
    # rests before its retry: held, its lease renewed, but in no scorer
    keys = await _dead_worker_with(ns, redis_url, "A", client, [f"rest{i}" for i in range(4)])
    b = await open_test_worker(worker_config(ns, redis_url, name="B", retry_for=3600), manager=Unavailable(None))
    deadline = time.monotonic() + 20
    while len(b.flights.resting) < 4:
        assert time.monotonic() < deadline, "the second worker did not reclaim all four and rest them"
        await b.maintain()
        await asyncio.sleep(0.2)
    assert all(sync_redis.hget(ks.traj(0, f"rest{i}_0"), "shared") == b"0" for i in range(4))
    # When the second worker dies while they rest (SIGKILL: nothing is taken back)
    b.rounds.parts.quarantine.take_back = _nothing  # type: ignore[method-assign,assignment]  # a killed process runs no clean-up
    await abandon_worker(b)
    res, at_once = await _scored_by_a_fresh_worker(ns, redis_url, client, keys)
    # Then they are scored side by side again: waiting for a retry took no worker down
    assert [r.reward_score for r in res.values()] == [3.0, 4.0, 5.0, 6.0]
    assert at_once > 1
    for i in range(4):
        assert sync_redis.hmget(ks.traj(0, f"rest{i}_0"), "attempts", "shared", "solo") == [b"3", b"1", None]
    client.close()


async def _nothing(*args: Any) -> None:
    return None


def _all_started(sync_redis: SyncClient, ks: Keyspace, n: int, prefix: str) -> bool:
    return all(sync_redis.hget(ks.traj(0, f"{prefix}{i}_0"), "shared") == b"1" for i in range(n))


async def test_a_trajectory_handed_back_at_shutdown_is_not_quarantined(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    (key,) = client.put_trajectory("handed", "0", [output(2, 5)], SAMPLE)
    # Given a worker stopping (SIGTERM) while it scores a trajectory that outlasts its grace
    await stop_while_scoring(worker_config(ns, redis_url, name="A", shutdown_grace=0.3))
    # Then the attempt its lease counted is taken back when it hands the trajectory back
    assert sync_redis.hget(ks.traj(0, "handed_0"), "attempts") == b"0"
    res, _ = await _scored_by_a_fresh_worker(ns, redis_url, client, [key])
    # And the next worker scores it as a first attempt (no solo start counted)
    assert res[key].status == "ok" and res[key].reward_score == 5.0
    assert sync_redis.hmget(ks.traj(0, "handed_0"), "attempts", "solo") == [b"1", None]
    client.close()
