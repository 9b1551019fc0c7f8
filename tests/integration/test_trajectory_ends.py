"""Every trajectory ends: what a manager raises, commits that keep failing, workers that die.

* A manager raising ``CancelledError`` (or another ``BaseException``) gets its trajectory an error
  result at once, well within ``score_timeout``; nothing stays held or leased.
* A trajectory delivered more than ``max_deliveries`` times gets one dead letter and an error on
  every key; its reason names a crash only when a worker really died, and the failed commits
  when that is what happened.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ResponseError

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from tests.support.cli_procs import wait_for
from tests.support.helpers import SAMPLE, Hang, output, running_workers, until
from tests.support.hostile_results import HostileResultManager
from tests.support.managers import LengthManager
from tests.support.proc_worker import WorkerProcess
from tests.support.records import TOK, text_output
from tests.support.sync_client import SyncClient, connect

#: Far above how long any error takes to come back even on a loaded machine, so that a manager's
#: odd exception ending only when score_timeout passes is told apart from a slow machine.
SCORE_TIMEOUT = 600.0
#: How long the error result may take: a sixth of score_timeout.
ERROR_WITHIN = SCORE_TIMEOUT / 6


def _push(client: RewardClient, uid: str, text: str, n: int = 2) -> list[str]:
    outs = [text_output("turn")] * (n - 1) + [text_output(text)]
    return client.put_trajectory(uid, "0", outs, {"data_source": "t", "reward_model": {"ground_truth": "0.5"}})


@pytest.mark.parametrize(
    "text, reason",
    [
        ("cancel", "raised CancelledError although the worker did not cancel it"),
        ("base", "raised Odd, a BaseException that is not an Exception: an odd BaseException"),
    ],
)
async def test_a_manager_raising_cancelled_or_a_base_exception_gets_an_error_within_score_timeout(
    ns: str, redis_url: str, sync_redis: SyncClient, text: str, reason: str
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    async with running_workers(ns, redis_url, [HostileResultManager(TOK)], score_timeout=SCORE_TIMEOUT) as (w,):
        t0 = time.monotonic()
        bad = _push(client, "bad", text)
        good = _push(client, "good", "fine")
        got = await asyncio.to_thread(client.wait_rewards, bad, ERROR_WITHIN)
        elapsed = time.monotonic() - t0
        ok = await asyncio.to_thread(client.wait_rewards, good, 120)
        held = dict(w.in_flight)
    print(f"\n{text}: error result after {elapsed:.2f}s (score_timeout {SCORE_TIMEOUT:g}s)")
    assert elapsed < ERROR_WITHIN
    assert {x.status for x in got.values()} == {"error"} and all(reason in (x.error or "") for x in got.values())
    assert {x.status for x in ok.values()} == {"ok"}
    assert held == {}  # nothing handed back or held: the trajectory ended
    h = sync_redis.hgetall(ks.traj(0, "bad_0"))
    assert h[b"state"] == b"done" and b"lease" not in h
    assert [f[b"kind"] for _, f in sync_redis.xrange(ks.dead(0))] == [b"scoring"]
    client.close()


async def test_a_trajectory_whose_commits_keep_failing_ends_as_a_dead_letter_blaming_no_crash(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    async with running_workers(
        ns,
        redis_url,
        [LengthManager(None)],
        max_deliveries=2,
        claim_idle=1.0,
        lease_seconds=1.0,
        heartbeat_interval=0.2,
    ) as (w,):

        async def refused(*args: Any, **kwargs: Any) -> bool:
            raise ResponseError("simulated refusal of the commit")

        w.commits.commit = refused  # type: ignore[method-assign]  # every commit fails
        keys = client.put_trajectory("stuck", "s", [output(2, 3), output(2, 4), output(2, 5)], SAMPLE)
        got = await asyncio.to_thread(client.wait_rewards, keys, 60)
    # Then every key has an error, and one dead letter says what happened
    assert {x.status for x in got.values()} == {"error"}
    dead = sync_redis.xrange(ks.dead(0))
    assert [(f[b"kind"], f[b"tid"]) for _, f in dead] == [(b"exhausted", b"stuck_s")]
    reason = dead[0][1][b"reason"].decode()
    assert "delivered 3 times without an answer (max_deliveries=2)" in reason
    assert "2 attempt(s) failed without a result, the last because its result could not be written" in reason
    assert "simulated refusal of the commit" in reason
    assert "died" not in reason and "crash" not in reason
    assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0
    client.close()


@pytest.mark.slow
def test_a_trajectory_whose_worker_died_says_so_when_it_runs_out_of_deliveries(
    ns: str, redis_url: str, tmp_path: Path
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    marks = tmp_path / "marks"
    marks.mkdir()
    fast: dict[str, Any] = dict(
        heartbeat_interval=0.3, lease_seconds=1.5, claim_idle=2.0, maintenance_interval=0.3, block_ms=200
    )
    doomed = WorkerProcess(
        redis_url,
        ns,
        log_dir=tmp_path,
        manager="tests.support.managers:EchoManager",
        manager_options={"sleep": 60, "mark_dir": str(marks)},
        max_deliveries=1,
        **fast,
    )
    keys = client.put_trajectory("dies", "s", [output(2, 3), output(2, 4)], SAMPLE)
    try:
        wait_for(lambda: any(marks.iterdir()), 120, "the worker to start scoring")
        doomed.kill()  # the worker dies while scoring: its attempt never reports back
        heir = WorkerProcess(  # the same scoring configuration (one namespace, one configuration)
            redis_url,
            ns,
            log_dir=tmp_path,
            manager="tests.support.managers:EchoManager",
            manager_options={"sleep": 60, "mark_dir": str(marks)},
            max_deliveries=1,
            **fast,
        )
        try:
            got = client.wait_rewards(keys, timeout=120)
        finally:
            heir.terminate(30)
    finally:
        doomed.kill()
    assert {x.status for x in got.values()} == {"error"}
    (dead,) = sync_redis_dead(redis_url, ks)
    assert dead[b"kind"] == b"exhausted"
    reason = dead[b"reason"].decode()
    assert "delivered 2 times without an answer (max_deliveries=1)" in reason
    assert "1 scoring attempt(s) never reported back: the worker scoring it died" in reason
    client.close()


def sync_redis_dead(url: str, ks: Keyspace) -> list[dict[bytes, bytes]]:
    r = connect(url)
    try:
        return [f for _, f in r.xrange(ks.dead(0))]
    finally:
        r.close()


async def test_a_trajectory_handed_back_past_max_deliveries_says_its_workers_were_stopping(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    keys = client.put_trajectory("back", "s", [output(2, 3), output(2, 4)], SAMPLE)
    settings: dict[str, Any] = dict(max_deliveries=1, shutdown_grace=0.5)
    # Given a worker that stops (hands its trajectory back) while the manager still runs
    async with running_workers(ns, redis_url, [Hang(None)], name_prefix="first", **settings) as (w,):
        await until(lambda: w.in_flight, "the trajectory to be scored", 120)
    assert sync_redis.hget(ks.traj(0, "back_s"), "handbacks") == b"1"
    # When the next worker finds it handed back once more than max_deliveries allows
    async with running_workers(ns, redis_url, [Hang(None)], name_prefix="second", **settings):
        got = await asyncio.to_thread(client.wait_rewards, keys, 120)
    # Then every key has an error whose reason says the workers were stopping, not that one died
    assert {x.status for x in got.values()} == {"error"}
    (dead,) = [f for _, f in sync_redis.xrange(ks.dead(0))]
    reason = dead[b"reason"].decode()
    assert (
        dead[b"kind"] == b"exhausted"
        and "1 attempt(s) were handed back unfinished by workers that were stopping" in reason
    )
    assert "died" not in reason and "never scored" not in reason
    client.close()
