"""The two phases, driven the same way for both systems through verl's ``_compute_score``.

``score(outputs, kwargs=row)`` is verl's own ``AgentLoopWorker._compute_score`` or rewardq's
``RewardqAgentLoopWorker._compute_score``, called as verl's multi-output path calls it (every
output of the trajectory). The outputs are built before the clock starts, fresh for every
round (the call writes the reward onto the final one).

* **burst**: every trajectory submitted at once (``asyncio.gather``, as an agent-loop worker runs
  its batch); wall time from the first submit to the last reward; CPU per process group.
* **steady**: trajectories started on a fixed schedule (open loop) at ``rate`` per second; the
  latency of each call; the first ``warmup`` are not counted.

Every reward is compared with the reference (:mod:`benchmarks.verl_loop.reference`).
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from benchmarks.procfs import load
from benchmarks.verl_loop.procs import CpuReader
from benchmarks.verl_loop.reference import References
from benchmarks.verl_loop.trajectories import Trajectory

Score = Callable[..., Awaitable[None]]


def check(trajs: list[Trajectory], outs: list[list[Any]], refs: References) -> dict[str, int]:
    """Counts of rewards equal to the reference, explained by verl's padding, wrong, missing, errors."""
    counts = {"ok": 0, "padding_bug": 0, "wrong": 0, "missing": 0, "errors": 0}
    for t, o in zip(trajs, outs):
        got = o[-1].reward_score
        if o[-1].extra_fields.get("reward_error"):
            counts["errors"] += 1
        if got is None:
            counts["missing"] += 1
        elif math.isclose(float(got), refs.right[t.index], abs_tol=1e-9):
            counts["ok"] += 1
        elif math.isclose(float(got), refs.verl[t.index], abs_tol=1e-9):
            counts["padding_bug"] += 1
        else:
            counts["wrong"] += 1
    return counts


def _cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


async def burst(score: Score, trajs: list[Trajectory], refs: References, cpu: CpuReader) -> dict[str, Any]:
    """One burst of ``trajs``: wall, CPU per group, reward checks."""
    outs = [t.verl_outputs() for t in trajs]
    rows = [t.kwargs() for t in trajs]
    gc.collect()
    load_before = load()
    c0, t0 = cpu(), time.perf_counter()
    await asyncio.gather(*(score(o, kwargs=k) for o, k in zip(outs, rows)))
    wall = time.perf_counter() - t0
    spent = _cpu_delta(c0, cpu())
    return {
        "phase": "burst",
        "trajectories": len(trajs),
        "outputs": sum(t.n for t in trajs),
        "wall_s": wall,
        "cpu_s": spent,
        "load": f"{load_before} -> {load()}",
        "check": check(trajs, outs, refs),
    }


async def steady(
    score: Score, trajs: list[Trajectory], refs: References, cpu: CpuReader, *, rate: float, warmup: int
) -> dict[str, Any]:
    """``trajs`` started at ``rate`` per second; latency percentiles of all but the first ``warmup``."""
    outs = [t.verl_outputs() for t in trajs]
    rows = [t.kwargs() for t in trajs]
    gc.collect()
    latencies: list[float] = [math.nan] * len(trajs)

    async def one(i: int) -> None:
        t = time.perf_counter()
        await score(outs[i], kwargs=rows[i])
        latencies[i] = time.perf_counter() - t

    load_before = load()
    c0, t0 = cpu(), time.perf_counter()
    tasks = []
    for i in range(len(trajs)):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    spent = _cpu_delta(c0, cpu())
    measured = np.asarray(latencies[warmup:]) * 1000.0
    return {
        "phase": "steady",
        "rate": rate,
        "trajectories": len(trajs),
        "samples": int(measured.shape[0]),
        "outputs": sum(t.n for t in trajs),
        "wall_s": wall,
        "cpu_s": spent,
        "p50_ms": float(np.percentile(measured, 50)),
        "p99_ms": float(np.percentile(measured, 99)),
        "max_ms": float(measured.max()),
        "load": f"{load_before} -> {load()}",
        "check": check(trajs, outs, refs),
    }
