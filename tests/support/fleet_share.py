"""How a fleet of real worker processes shares a backlog, and how fast it takes over a dead worker's entries.

Used by ``tests/integration/test_fleet_share.py`` (conditions with generous bounds) and by
``python -m benchmarks.fleet_share`` (the numbers). Every worker is a
:class:`~tests.support.proc_worker.WorkerProcess` running ``EchoManager`` (an ``asyncio.sleep``
per trajectory, so scoring time does not depend on how busy the machine is).

* :func:`share_backlog`: three workers start and register, are paused (SIGSTOP), a backlog is
  pushed, and all three resume at once (SIGCONT): whichever reads first finds the whole backlog
  waiting, which is what a fleet started on a backlog sees. Returns how many trajectories each scored.
* :func:`recover_dead_worker`: three workers score a backlog that lasts well past ``claim_idle``;
  one is SIGKILLed while it holds pending entries. Returns when (after the kill) the last of the
  trajectories it held was finished, and when the whole backlog was, from the ``done`` stream's
  entry ids (Redis's own clock, milliseconds).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace, split_key
from tests.support.exactly_once import Trajectory, done_counts, make_trajectories, push, settle
from tests.support.proc_worker import WorkerProcess
from tests.support.sync_client import SyncClient

ECHO = "tests.support.managers:EchoManager"
START_TIMEOUT = 120.0  # three workers importing torch at once on a busy 2-core machine


def _wait(cond: Callable[[], object], timeout: float, what: str, workers: list[WorkerProcess]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        dead = [w for w in workers if not w.alive()]
        if dead:
            raise AssertionError(f"{dead[0].name} exited while waiting for {what}:\n{dead[0].log()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _started(w: WorkerProcess) -> Callable[[], bool]:
    return lambda: f"worker {w.name} started" in w.log()


@contextmanager
def fleet(url: str, ns: str, log_dir: Path, n: int, **settings: Any) -> Iterator[list[WorkerProcess]]:
    """``n`` started worker processes on ``ns`` (each logged its start line); killed by PID at the end."""
    workers = [WorkerProcess(url, ns, log_dir=log_dir, name=f"w{i}-{ns}", **settings) for i in range(n)]
    try:
        for w in workers:
            _wait(_started(w), START_TIMEOUT, f"{w.name} to start", workers)
        yield workers
    finally:
        for w in workers:
            if w.alive():
                w.proc.send_signal(signal.SIGCONT)  # a stopped process would not die of SIGTERM
            w.kill()


def _expected(jobs: list[Trajectory]) -> dict[str, Any]:
    return {k: v for t in jobs for k, v in t.expected.items()}


def _scored_by(client: RewardClient, keys: list[str]) -> Counter[str]:
    """Trajectories scored per worker (a trajectory counted once, by its first key's result)."""
    firsts = {split_key(k)[0]: k for k in reversed(keys)}
    res = client.get_rewards(list(firsts.values()))
    return Counter(r.worker for r in res.values() if r is not None)


@dataclass
class Share:
    """What :func:`share_backlog` saw: trajectories scored per worker, and the exactly-once verdict."""

    per_worker: dict[str, int]
    clean: bool
    explain: str

    @property
    def counts(self) -> list[int]:
        return sorted(self.per_worker.values(), reverse=True)


def share_backlog(
    url: str, r: SyncClient, ns: str, log_dir: Path, *, backlog: int = 150, sleep: float = 0.5, **settings: Any
) -> Share:
    """Three workers resumed at once on a backlog of ``backlog`` one-output trajectories (module doc)."""
    jobs = make_trajectories(backlog, seed=7, max_outputs=1, prefix="b")
    with fleet(url, ns, log_dir, 3, manager=ECHO, manager_options={"sleep": sleep}, **settings) as workers:
        for w in workers:
            w.proc.send_signal(signal.SIGSTOP)
        client = RewardClient.from_url(url, namespace=ns)
        try:
            keys = push(client, jobs)
            for w in workers:
                w.proc.send_signal(signal.SIGCONT)
            client.wait_rewards(keys, timeout=max(120.0, backlog * sleep * 2))
            verdict = settle(r, Keyspace(ns), _expected(jobs))
            counts = _scored_by(client, keys)
        finally:
            client.close()
        per_worker = {w.name: counts.get(w.name, 0) for w in workers}
    return Share(per_worker, verdict.clean and not any(verdict.leftovers.values()), verdict.explain())


@dataclass
class Recovery:
    """What :func:`recover_dead_worker` saw (times in seconds after the SIGKILL, by Redis's clock)."""

    held: int  # entries pending for the killed worker when it died
    held_trajectories: int
    last_of_dead: float  # the last of the killed worker's trajectories finished
    all_done: float  # the whole backlog finished
    done_after_last_of_dead: int  # trajectories that finished after the last of the dead worker's
    finished_once: bool  # every trajectory finished exactly once (the done stream)
    clean: bool
    explain: str
    per_worker: dict[str, int] = field(default_factory=dict)


def _ms(eid: bytes) -> int:
    return int(eid.split(b"-")[0])


def recover_dead_worker(
    url: str,
    r: SyncClient,
    ns: str,
    log_dir: Path,
    *,
    backlog: int = 600,
    sleep: float = 1.0,
    kill_after: int = 20,
    **settings: Any,
) -> Recovery:
    """Three workers on a backlog; one SIGKILLed once ``kill_after`` trajectories are done (module doc)."""
    ks = Keyspace(ns)
    jobs = make_trajectories(backlog, seed=11, max_outputs=1, prefix="d")
    with fleet(url, ns, log_dir, 3, manager=ECHO, manager_options={"sleep": sleep}, **settings) as workers:
        victim = workers[0]
        client = RewardClient.from_url(url, namespace=ns)
        try:
            keys = push(client, jobs)
            _wait(lambda: r.xlen(ks.done(0)) >= kill_after, 120, f"{kill_after} trajectories done", workers)
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(30)
            secs, micros = r.execute_command("TIME")
            killed_ms = int(secs) * 1000 + int(micros) // 1000
            raw: Any = r  # redis-py's xpending_range: SyncClient does not declare it
            held = raw.xpending_range(ks.stream(0), ks.group, "-", "+", 100_000, consumername=victim.name)
            held_ids = [p["message_id"] for p in held]
            held_tids = set()
            for eid in held_ids:
                got = r.xrange(ks.stream(0), eid, eid)
                if got:
                    held_tids.add(split_key(got[0][1][b"key"].decode())[0])
            client.wait_rewards(keys, timeout=max(300.0, backlog * sleep))
            verdict = settle(r, ks, _expected(jobs))
            per_tid, _ = done_counts(r, ks)
            finished = {tid: _ms(eid) for eid, f in r.xrange(ks.done(0)) for tid in [f[b"tid"].decode()]}
            counts = _scored_by(client, keys)
        finally:
            client.close()
    last_dead = max((finished[t] for t in held_tids), default=killed_ms)
    return Recovery(
        held=len(held_ids),
        held_trajectories=len(held_tids),
        last_of_dead=(last_dead - killed_ms) / 1000,
        all_done=(max(finished.values()) - killed_ms) / 1000,
        done_after_last_of_dead=sum(1 for t in finished.values() if t > last_dead),
        finished_once=all(per_tid[t.uid + "_" + t.session_id] == 1 for t in jobs),
        clean=verdict.clean and not any(verdict.leftovers.values()),
        explain=verdict.explain(),
        per_worker={w.name: counts.get(w.name, 0) for w in workers},
    )
