"""The harness all four peers share: fill, start the worker, time the drain, then latency.

Throughput: the backlog is enqueued *before* the worker starts (results off where the
framework lets a call say so), the worker subprocess starts with its recommended settings,
and the drain is timed from the first to the last completion seen on the task's ``INCR``
counter, exactly as for rewardq and the raw baseline. Latency: on the same, now warm,
worker, each trajectory is enqueued with results on and waited for through the framework's
own result API (what a trainer using it would call).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from benchmarks.common import Child, Cleanup, Row, Settings, connect, redis_cpu_seconds, watch_drain
from benchmarks.latency import measure, summarize
from benchmarks.peers.tasks import done_key, reward_key
from benchmarks.workload import Trajectory, Workload


class Peer(ABC):
    """One framework, driven from the benchmark process.

    Subclasses name the worker command and implement bulk enqueueing (results off) and one
    enqueue-and-wait call (results on).
    """

    name = ""
    #: what goes in the notes column: worker settings and how the payload is serialized
    settings_note = ""
    #: how the latency client waits for the result
    wait_note = ""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.prefix = s.prefix(self.name)
        self.env = {"BENCH_REDIS_URL": s.redis_url, "BENCH_PREFIX": self.prefix, "BENCH_SCORER": s.scorer}
        self._jobs = 0

    @abstractmethod
    def worker_cmd(self) -> list[str]:
        """argv of the worker process (its recommended settings for this job shape)."""

    @abstractmethod
    def enqueue_many(self, payloads: Iterable[dict[str, Any]]) -> None:
        """Enqueue one job per payload, results not stored."""

    @abstractmethod
    def call(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Enqueue one job with results on and block until the framework returns them."""

    def patterns(self) -> list[str]:
        """Every key pattern this peer may have written (all carry the run id)."""
        return [f"{self.prefix}*"]

    def finish(self) -> None:
        """Forget framework-global registrations (sets of workers/queues) and close clients."""

    def payload(self, traj: Trajectory) -> dict[str, Any]:
        return traj.job_payload()

    def job_id(self) -> str:
        """A fresh job id carrying the run's prefix (for peers whose jobs are named by the client)."""
        self._jobs += 1
        return f"{self.prefix}-{self._jobs}"


def check(r: Any, prefix: str, trajs: list[Trajectory], scorer: str) -> str:
    pipe = r.pipeline(transaction=False)
    for t in trajs:
        pipe.hget(reward_key(prefix, t.keys[-1]), "score")
    got = pipe.execute()
    bad = sum(1 for t, g in zip(trajs, got) if g is None or float(g) != t.expected_for(scorer))
    return "ok" if bad == 0 else f"{bad}/{len(trajs)} wrong"


def run(peer: Peer, cleanup: Cleanup) -> list[Row]:
    s = peer.s
    cleanup.add(*peer.patterns())
    r = connect(s.redis_url)
    rows: list[Row] = []
    child: Child | None = None
    try:
        if "throughput" in s.phases:
            wl = Workload(s.seed, tag=f"{peer.name}-")
            peer.enqueue_many(peer.payload(t) for t in wl.range(0, s.trajectories))
            nt = s.trajectories
            no = sum(wl[i].n for i in range(nt))
            child = Child(peer.worker_cmd(), s.workdir / f"{peer.prefix}-worker.log", env=peer.env)
            d = watch_drain(
                lambda: int(r.get(done_key(peer.prefix)) or 0),
                nt,
                s.drain_timeout,
                alive=child.alive,
                snaps={"cpu": child.cpu_seconds, "redis": lambda: redis_cpu_seconds(r)},
            )
            row = Row(
                peer.name,
                "throughput",
                1,
                outputs=round(no * d.last_count / nt),
                rss_mb=child.peak_rss_mb(),
                note=peer.settings_note,
                check=check(
                    r,
                    peer.prefix,
                    [wl[i] for i in range(0, max(1, d.last_count), max(1, d.last_count // 50))],
                    s.scorer,
                ),
                **d.row_fields(nt, no),
            )
            if not child.alive():
                row.status = f"error: worker exited ({child.log_tail(300)})"
            rows.append(row)
        if "latency" in s.phases and (child is None or child.alive()):
            if child is None:
                child = Child(peer.worker_cmd(), s.workdir / f"{peer.prefix}-worker.log", env=peer.env)
            rows.append(latency(peer, child))
    finally:
        if child is not None:
            child.stop()
        try:
            peer.finish()
        finally:
            r.close()
            cleanup.run(peer.patterns())
    return rows


def latency(peer: Peer, child: Child) -> Row:
    s = peer.s
    wl = Workload(s.seed + 1, tag=f"{peer.name}-lat-")
    first = wl[10_000_000]
    peer.call(peer.payload(first), timeout=s.start_timeout)  # the worker is up and warm
    bad: list[str] = []

    def one(i: int) -> None:
        traj = wl[i]
        got = peer.call(peer.payload(traj), timeout=10.0)
        if got.get(traj.keys[-1]) != traj.expected_for(s.scorer):
            bad.append(traj.tid)

    row = summarize(peer.name, measure(s, one), s, f"{s.latency_rate:g} traj/s; {peer.wait_note}")
    row.check = "ok" if not bad else f"{len(bad)} wrong"
    row.rss_mb = child.peak_rss_mb()
    return row
