"""Latency at a low steady rate: from the final output's ``put`` to its reward being readable.

For rewardq the measured call is the producer's own: ``RewardClient.put_trajectory`` (all
outputs in one pipeline, the final one last) followed by ``RewardClient.wait_rewards`` on
every key of the trajectory, which returns once the rewards can be read. Calls start on a
fixed schedule (:func:`benchmarks.common.paced`) at ``latency_rate`` trajectories per second
after ``latency_warmup`` unmeasured ones, against a worker that is already running
(the one that just drained the throughput backlog).

The peers and the raw baseline measure the same interval with their own ways of waiting
(see their modules): this module holds rewardq's and the shared summary.
"""

from __future__ import annotations

from typing import Callable

from benchmarks.common import Child, Row, Settings, paced, percentiles
from benchmarks.workload import Workload


def summarize(system: str, samples: list[float], s: Settings, note: str, workers: int = 1) -> Row:
    """A latency row from per-trajectory durations in seconds."""
    if not samples:
        return Row(system, "latency", workers, status="error: no sample finished", note=note)
    p50, p99, mx = percentiles(samples)
    status = "ok" if len(samples) == s.latency_samples else "partial"
    return Row(system, "latency", workers, trajectories=len(samples), p50_ms=p50, p99_ms=p99, max_ms=mx,
               status=status, note=note)


def measure(s: Settings, one: Callable[[int], None]) -> list[float]:
    """Warm up, then time ``s.latency_samples`` calls of ``one(i)`` at ``s.latency_rate``."""
    paced(s.latency_warmup, s.latency_rate, one, s.latency_timeout)
    return paced(s.latency_samples, s.latency_rate, lambda i: one(i + s.latency_warmup), s.latency_timeout)


def rewardq_latency(s: Settings, namespace: str, worker: Child) -> Row:
    """Latency through rewardq's blocking client against a running worker in ``namespace``."""
    from rewardq import RewardClient

    wl = Workload(s.seed + 1, tag="rqlat-")
    client = RewardClient.from_url(s.redis_url, namespace=namespace, max_backlog=None)
    bad: list[str] = []
    scored_ms: list[float] = []

    def one(i: int) -> None:
        traj = wl[i]
        keys = client.put_trajectory(traj.uid, traj.session_id, traj.outputs(), traj.sample())
        got = client.wait_rewards(keys, timeout=10.0)
        final = got[keys[-1]]
        if not final.ok or final.reward_score != traj.expected:
            bad.append(traj.tid)
        if final.latency_ms is not None:
            scored_ms.append(final.latency_ms)

    try:
        samples = measure(s, one)
    finally:
        client.close()
    note = f"{s.latency_rate:g} traj/s, put_trajectory + wait_rewards"
    if len(scored_ms) > s.latency_warmup:
        import numpy as np

        w = np.asarray(scored_ms[s.latency_warmup:])
        note += (f"; worker's own latency_ms (put ts -> scored, before commit) p50 {np.percentile(w, 50):.2f} "
                 f"p99 {np.percentile(w, 99):.2f}")
    row = summarize("rewardq", samples, s, note)
    row.check = "ok" if not bad else f"{len(bad)} wrong"
    row.rss_mb = worker.peak_rss_mb()
    return row
