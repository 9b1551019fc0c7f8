"""Latency at a low steady rate: from the final output's ``put`` to its reward being readable.

For rewardq the measured call is the producer's own. In the default ``final`` mode
(:attr:`Settings.latency_mode`) outputs ``0..n-2`` are put first with
``RewardClient.put_output``, untimed, as an agent loop emits them turn by turn; after a
short gap the clock starts at the final output's ``put_output(..., final=True)`` and stops
when ``RewardClient.wait_rewards`` on every key returns. In ``whole`` mode one
``put_trajectory`` (every output in one pipeline) is inside the timed interval too. Calls start on a
fixed schedule (:func:`benchmarks.common.paced`) at ``latency_rate`` trajectories per second
after ``latency_warmup`` unmeasured ones, against a worker that is already running
(the one that just drained the throughput backlog).

The peers and the raw baseline measure the same interval with their own ways of waiting
(see their modules): this module holds rewardq's and the shared summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from benchmarks.common import Child, Row, Settings, paced, percentiles
from benchmarks.workload import Workload


def summarize(system: str, samples: list[float], s: Settings, note: str, workers: int = 1) -> Row:
    """A latency row from per-trajectory durations in seconds."""
    if not samples:
        return Row(system, "latency", workers, status="error: no sample finished", note=note)
    p50, p99, mx = percentiles(samples)
    status = "ok" if len(samples) == s.latency_samples else "partial"
    return Row(
        system,
        "latency",
        workers,
        trajectories=len(samples),
        p50_ms=p50,
        p99_ms=p99,
        max_ms=mx,
        status=status,
        note=note,
    )


def measure(s: Settings, one: Callable[[int], float | None]) -> list[float]:
    """Warm up, then time ``s.latency_samples`` calls of ``one(i)`` at ``s.latency_rate``."""
    paced(s.latency_warmup, s.latency_rate, one, s.latency_timeout)
    return paced(s.latency_samples, s.latency_rate, lambda i: one(i + s.latency_warmup), s.latency_timeout)


def rewardq_latency(s: Settings, namespace: str, worker: Child, system: str = "rewardq") -> Row:
    """Latency through rewardq's blocking client against a running worker in ``namespace``."""
    from rewardq import RewardClient

    wl = Workload(s.seed + 1, tag="rqlat-")
    client = RewardClient.from_url(s.redis_url, namespace=namespace, max_backlog=None)
    bad: list[str] = []
    scored_ms: list[float] = []

    def one(i: int) -> float | None:
        traj = wl[i]
        outputs, sample = traj.outputs(), traj.sample()
        t0 = None
        if s.latency_mode == "final":
            keys = [client.put_output(traj.uid, traj.session_id, j, out, sample) for j, out in enumerate(outputs[:-1])]
            if keys:
                time.sleep(s.latency_gap)  # the earlier turns came in long before the last one
            t0 = time.perf_counter()
            keys.append(client.put_output(traj.uid, traj.session_id, len(outputs) - 1, outputs[-1], sample, final=True))
        else:
            keys = client.put_trajectory(traj.uid, traj.session_id, outputs, sample)
        got = client.wait_rewards(keys, timeout=10.0)
        took = None if t0 is None else time.perf_counter() - t0
        final = got[keys[-1]]
        if not final.ok or final.reward_score != traj.expected_for(s.scorer):
            bad.append(traj.tid)
        if final.latency_ms is not None:
            scored_ms.append(final.latency_ms)
        return took

    try:
        samples = measure(s, one)
    finally:
        client.close()
    note = (
        f"{s.latency_rate:g} traj/s, put_output(final) + wait_rewards after outputs 0..n-2"
        if s.latency_mode == "final"
        else f"{s.latency_rate:g} traj/s, put_trajectory + wait_rewards"
    )
    if len(scored_ms) > s.latency_warmup:
        import numpy as np

        w = np.asarray(scored_ms[s.latency_warmup :])
        note += (
            f"; worker's own latency_ms (put ts -> scored, before commit) p50 {np.percentile(w, 50):.2f} "
            f"p99 {np.percentile(w, 99):.2f}"
        )
    row = summarize(system, samples, s, note)
    row.check = "ok" if not bad else f"{len(bad)} wrong"
    row.rss_mb = worker.peak_rss_mb()
    return row
