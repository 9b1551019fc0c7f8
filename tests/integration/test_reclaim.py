"""A reclaimed batch is not a poisoned trajectory: real `rewardq worker` processes running genrm
against the stand-in judge (4 s answers). The trajectories of a worker that was SIGKILLed, or paused
(SIGSTOP) past ``claim_idle``, are judged again side by side by the worker that reclaims them, each
request paid at most twice, and none of them is quarantined.

Parallelism is asserted from the judge's own log, not from a wall clock: the reclaiming worker's
requests overlap in time (a serial reclaim sends one request per 4 s answer, so at most one of them
would ever be in flight; here at least half of them are)."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from tests.support.cli_procs import START_WAIT, Proc, Procs, wait_for, worker_argv
from tests.support.judge_standin import JudgeStandin
from tests.support.records import text_output
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.slow

SAMPLE = {"data_source": "judged", "reward_model": {"ground_truth": "42"}}
ANSWER_S = 4.0
#: short leases and idle times, so a dead worker's work is reclaimed within seconds
RECOVERY = [
    *["--claim-idle", "3", "--lease-seconds", "3", "--heartbeat-interval", "0.5"],
    *["--maintenance-interval", "0.5", "--log-level", "INFO"],
]


@pytest.fixture
def judge(tmp_path: Path) -> Iterator[JudgeStandin]:
    s = JudgeStandin(tmp_path)
    s.control(delay=ANSWER_S)
    yield s
    s.stop()


@dataclass
class Fleet:
    """genrm workers started on one namespace against the stand-in judge, and what the tests read."""

    procs: Procs
    redis_url: str
    ns: str
    judge: JudgeStandin
    tmp_path: Path
    sync_redis: SyncClient

    def start(self, name: str) -> Proc:
        config = self.judge.genrm_config(self.tmp_path, model="m", lease_seconds=3)  # claims lapse 3 s after a death
        argv = worker_argv(self.redis_url, self.ns, name, "--config", str(config), *RECOVERY)
        return self.procs.start(argv, tag=name)

    def start_registered(self, name: str, beside: Proc) -> Proc:
        """Worker ``name``, once it has registered (``beside``, the worker already running, must stay up)."""
        w = self.start(name)
        wait_for(
            lambda: self.sync_redis.exists(f"{self.ns}:worker:{name}"),
            START_WAIT,
            f"worker {name}",
            procs=[beside, w],
        )
        return w

    def busy_worker(self) -> tuple[Proc, RewardClient, list[str]]:
        """Worker ``a`` with the 20 judge calls of :func:`_put`'s trajectories in flight, the producer, the keys."""
        a = self.start("a")
        client = RewardClient.from_url(self.redis_url, namespace=self.ns)
        keys = _put(client, 20)
        # (its start-up first, which may take longer than its judge calls: torch's import alone took 72 s
        # on a loaded machine)
        wait_for(lambda: self.sync_redis.exists(f"{self.ns}:worker:a"), START_WAIT, "worker a", procs=[a])
        wait_for(lambda: self.judge.stats()["in_flight"] >= 20, 90, "20 judge calls in flight", procs=[a])
        return a, client, keys


@pytest.fixture
def fleet(procs: Procs, redis_url: str, ns: str, judge: JudgeStandin, tmp_path: Path, sync_redis: SyncClient) -> Fleet:
    return Fleet(procs, redis_url, ns, judge, tmp_path, sync_redis)


def _sigkill(w: Proc) -> float:
    """SIGKILL ``w`` and wait until it is gone; returns when."""
    w.popen.send_signal(signal.SIGKILL)
    w.popen.wait(timeout=10)
    return time.time()


def _put(client: RewardClient, n: int) -> list[str]:
    """``n`` one-output trajectories ``t<i>``, each judged ``i / 100``."""
    outputs = [(f"t{i}", [text_output(f"grade=0.{i:02d}")]) for i in range(n)]
    return [key for tid, outs in outputs for key in client.put_trajectory(tid, "s", outs, SAMPLE)]


def _log(judge: JudgeStandin) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = judge.call("/log")
    return entries


def _most_at_once(arrivals: list[float], answer_s: float) -> int:
    """The most requests in flight at once, each answered ``answer_s`` after it arrived."""
    return max(sum(1 for u in arrivals if t <= u < t + answer_s) for t in arrivals)


def _check_answers(client: RewardClient, keys: list[str], timeout: float) -> float:
    """Wait for every key; each has the judge's score, none an error. Returns when the last came."""
    results = client.wait_rewards(keys, timeout=timeout)
    done = time.time()
    for i, key in enumerate(keys):
        r = results[key]
        assert r.status == "ok" and r.reward_score == pytest.approx(i / 100), r
    return done


def _sent_side_by_side(judge: JudgeStandin, since: float) -> tuple[list[dict[str, Any]], list[float], int]:
    """The judge's log, the requests that arrived after ``since``, and the most of them in flight at
    once, which must be at least 10 of 20 (a serial reclaim has one in flight at a time)."""
    log = _log(judge)
    again = sorted(e["t"] for e in log if e["t"] > since)
    at_once = _most_at_once(again, ANSWER_S)
    assert at_once >= 10, f"only {at_once} of the reclaimed judge calls overlapped: they were sent one by one"
    return log, again, at_once


def _never_quarantined(sync_redis: SyncClient, ns: str, n: int, *workers: Proc) -> None:
    _never_quarantined_alone(sync_redis, ns, n)
    for w in workers:
        assert "scoring it alone" not in w.stderr(), w.stderr()[-3000:]


def test_a_sigkilled_workers_twenty_judge_calls_are_sent_again_side_by_side(
    fleet: Fleet, ns: str, sync_redis: SyncClient, judge: JudgeStandin
) -> None:
    # Given a genrm worker with 20 judge calls in flight (held by the judge until the kill), and
    # another worker running beside it with nothing to do
    judge.control(delay=600)
    a, client, keys = fleet.busy_worker()
    b = fleet.start_registered("b", beside=a)
    judge.control(delay=ANSWER_S)
    # When the first one is SIGKILLed, and the second reclaims its trajectories
    killed = _sigkill(a)
    done = _check_answers(client, keys, timeout=240)
    # Then the reclaiming worker sent the 20 requests side by side, ...
    log, again, at_once = _sent_side_by_side(judge, killed)
    assert len(again) == 20, log
    wall = done - again[0]
    assert done - killed < 20 * ANSWER_S / 2, f"the reclaim took {done - killed:.1f} s for 20 answers of {ANSWER_S} s"
    # ... each request was paid at most twice (once by the dead worker, once again), ...
    paid = Counter(e["digest"] for e in log)
    assert len(paid) == 20 and max(paid.values()) <= 2, paid
    # ... and none of them was suspected of killing its worker
    _never_quarantined(sync_redis, ns, 20, b)
    print(
        f"SIGKILL with 20 judge calls in flight ({ANSWER_S:g} s answers): all 20 answered {done - killed:.1f} s "
        f"after the kill (claim_idle 3 s, leases 3 s), {wall:.1f} s after the reclaiming worker's first "
        f"request, {at_once} at once; requests paid {sum(paid.values())} for 20"
    )
    client.close()
    assert b.terminate() == 0, b.stderr()[-2000:]


def test_two_sigkills_in_a_row_leave_twenty_judge_calls_judged_in_one_cohort_not_one_by_one(
    fleet: Fleet, ns: str, sync_redis: SyncClient, judge: JudgeStandin
) -> None:
    ks = Keyspace(ns)
    # Given a genrm worker with 20 judge calls in flight (held by the judge until the kill)
    judge.control(delay=600)
    a, client, keys = fleet.busy_worker()
    # When it is SIGKILLed, a second worker reclaims the 20 and has them all in its scorer, side by side
    b = fleet.start_registered("b", beside=a)
    _sigkill(a)
    wait_for(
        lambda: all(sync_redis.hget(ks.traj(0, f"t{i}_s"), "shared") == b"1" for i in range(20)),
        120,
        "the 20 in the second worker's scorer",
        procs=[b],
    )
    # and it is SIGKILLed too, with a third worker waiting
    c = fleet.start_registered("c", beside=b)
    judge.control(delay=ANSWER_S)
    killed = _sigkill(b)
    done = _check_answers(client, keys, timeout=240)
    # Then the third worker judged the 20 suspects together (one cohort: none of them had been in
    # one), not one after another, ...
    log, again, at_once = _sent_side_by_side(judge, killed)
    assert len(again) == 20, log
    assert done - killed < 20 * ANSWER_S / 2, f"the reclaim took {done - killed:.1f} s for 20 answers of {ANSWER_S} s"
    # ... each request paid at most three times (once per worker), ...
    paid = Counter(e["digest"] for e in log)
    assert len(paid) == 20 and max(paid.values()) <= 3, paid
    # ... and each was scored in a cohort (its width recorded), none alone, none blamed
    widths = [sync_redis.hget(ks.traj(0, f"t{i}_s"), "width") for i in range(20)]
    assert all(w is not None and int(w) > 1 for w in widths), widths
    _never_quarantined_alone(sync_redis, ns, 20)
    assert "in a cohort of suspects (any size)" in c.stderr(), c.stderr()[-3000:]
    print(
        f"two SIGKILLs in a row, 20 judge calls ({ANSWER_S:g} s answers): all 20 answered {done - killed:.1f} s "
        f"after the second kill, {at_once} at once, cohort width(s) {sorted({int(w or 0) for w in widths})}; "
        f"requests paid {sum(paid.values())} for 20"
    )
    client.close()
    assert c.terminate() == 0, c.stderr()[-2000:]


def _never_quarantined_alone(sync_redis: SyncClient, ns: str, n: int) -> None:
    ks = Keyspace(ns)
    for i in range(n):
        assert sync_redis.hget(ks.traj(0, f"t{i}_s"), "solo") is None, f"t{i} was scored alone"


def test_a_worker_paused_past_claim_idle_has_its_work_reclaimed_side_by_side_and_blamed_on_nothing(
    fleet: Fleet, ns: str, sync_redis: SyncClient, judge: JudgeStandin
) -> None:
    # Given a genrm worker with 20 four-second judge calls in flight
    a, client, keys = fleet.busy_worker()
    # When it is paused (SIGSTOP) until another worker has reclaimed its trajectories, then resumed
    a.popen.send_signal(signal.SIGSTOP)
    paused = time.time()
    try:
        b = fleet.start_registered("b", beside=a)
        wait_for(lambda: sum(e["t"] > paused for e in _log(judge)) >= 20, 120, "the reclaim", procs=[b])
    finally:
        a.popen.send_signal(signal.SIGCONT)
    # Then every key is answered with its judge's score, ...
    _check_answers(client, keys, timeout=240)
    # ... the reclaiming worker sent its requests side by side, each request paid at most twice, ...
    log, _, at_once = _sent_side_by_side(judge, paused)
    paid = Counter(e["digest"] for e in log)
    assert len(paid) == 20 and max(paid.values()) <= 2, paid
    # ... no trajectory was scored alone or marked as having killed a worker, ...
    _never_quarantined(sync_redis, ns, 20, a, b)
    dead = sync_redis.xrange(Keyspace(ns).dead(0))
    assert dead == [], dead
    print(f"SIGSTOP past claim_idle, 20 judge calls in flight: {at_once} reclaimed at once, paid {sum(paid.values())}")
    # ... and the paused worker carries on, and stops cleanly
    client.close()
    assert a.terminate() == 0, a.stderr()[-2000:]
    assert b.terminate() == 0, b.stderr()[-2000:]
