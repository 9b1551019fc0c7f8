"""``python -m benchmarks.thread_cpu``: one drain, the worker's CPU per trajectory by thread.

Fills ``--trajectories`` GSM8K trajectories (the workload of ``python -m benchmarks``), starts the
raw loop or ``--workers`` rewardq workers (:mod:`benchmarks.worker_runner`, ``--extra`` passes
arguments on), times the drain as ``python -m benchmarks`` does, checks a sample of rewards, and
prints one JSON line: outputs/s, CPU ms per trajectory of the processes and of Redis, and of each
worker's event-loop thread (``main``) apart from its other threads (``other``: the decode thread),
read from ``/proc/<pid>/task/*/stat``. ``sched_s`` says where each worker's event-loop thread and
Redis spent the drain (from the go to the last completion seen): ``[on a core, ready but waiting for
one, asleep]`` seconds (``/proc/<pid>/task/<tid>/schedstat``; Redis's only when it runs on this
machine), so a drain whose wall time went to waiting for a core shows it. ``redis_commands``: the
calls and microseconds of Redis per trajectory of the commands that took most of its time during
the drain (``INFO commandstats``, every client of that Redis included; ``evalsha`` is 2.0 calls
when every trajectory is claimed whole and committed in one script each). For A/B runs, run it
from each tree in turn (``cd <tree> && PYTHONPATH=<tree> python -m benchmarks.thread_cpu``),
alternating.

    python -m benchmarks.thread_cpu --system raw --trajectories 3000
    python -m benchmarks.thread_cpu --trajectories 3000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import raw, rewardq_bench
from benchmarks.common import BenchRedis, Child, Cleanup, Settings, connect, redis_cpu_seconds, watch_drain
from benchmarks.procfs import cmdline, sched_seconds, thread_cpu
from benchmarks.workload import Workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--system", choices=["rewardq", "raw"], default="rewardq")
    p.add_argument("--trajectories", type=int, default=3000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--extra", default="", help="more arguments for each worker runner")
    a = p.parse_args()
    s = Settings(redis_url=a.url, seed=0)
    s.trajectories = a.trajectories
    s.run_id = f"tc{os.getpid():x}"
    s.workdir = Path(tempfile.mkdtemp(prefix="rqbench-threads-"))
    cleanup = Cleanup(s.redis_url)
    r = connect(s.redis_url)
    children: list[Child] = []
    try:
        wl = Workload(s.seed, tag=f"{a.system}-")
        count: Callable[[], int]
        if a.system == "raw":
            prefix = s.prefix("raw")
            cleanup.add(f"{prefix}:*")
            keys = raw.keys_of(prefix)
            r.xgroup_create(keys["stream"], raw.GROUP, id="0", mkstream=True)
            nt, no = raw.fill(r, keys["stream"], wl.range(0, a.trajectories))
            children = [raw.start_consumer(s, prefix, "c0", False)]

            def count() -> int:
                return int(r.xlen(keys["done"]))
        else:
            ns = s.prefix(f"rewardq{a.workers}w")
            cleanup.add(f"{ns}:*")
            nt, no = rewardq_bench.fill(s.redis_url, ns, wl.range(0, a.trajectories))
            children = rewardq_bench.start_workers(s, ns, a.workers, s.run_id, a.extra.split() or None)

            def count() -> int:
                return rewardq_bench.done_count(r, ns)

        before = {c.pid: thread_cpu(c.pid) for c in children}
        redis_pid = local_redis_pid(r)
        watched = [c.pid for c in children] + ([redis_pid] if redis_pid else [])
        sched0, stats0, t0 = {p: sched_seconds(p) for p in watched}, r.info("commandstats"), time.perf_counter()
        for c in children:
            c.go()
        d = watch_drain(
            count,
            nt,
            s.drain_timeout,
            snaps={"cpu": lambda: sum(c.cpu_seconds() for c in children), "redis": lambda: redis_cpu_seconds(r)},
        )
        span = (d.last_t or time.perf_counter()) - t0
        sched = {p: where_time_went(sched0[p], sched_seconds(p), span) for p in watched}
        commands = commands_per_trajectory(stats0, r.info("commandstats"), nt)
        threads = {"main": 0.0, "other": 0.0}
        for c in children:
            for tid, cpu in thread_cpu(c.pid).items():
                threads["main" if tid == c.pid else "other"] += cpu - before[c.pid].get(tid, 0.0)
        sample = [wl[i] for i in range(0, nt, max(1, nt // 50))]
        check = (
            raw.check_rewards(r, prefix, sample, False)
            if a.system == "raw"
            else rewardq_bench.check_rewards(r, ns, sample)
        )
        rate = d.rate
        print(
            json.dumps(
                {
                    "system": a.system,
                    "workers": a.workers if a.system == "rewardq" else 1,
                    "outputs_per_s": round(rate * no / nt) if rate else None,
                    "cpu_ms": d.per_completion_ms("cpu"),
                    "redis_cpu_ms": d.per_completion_ms("redis"),
                    "threads_ms": {k: round(1000 * v / max(1, d.last_count), 3) for k, v in threads.items()},
                    "sched_s": {
                        "span": round(span, 3),
                        "workers": [sched[c.pid] for c in children],
                        "redis": sched.get(redis_pid) if redis_pid else None,
                    },
                    "redis_commands": commands,
                    "check": check,
                    "load": os.getloadavg()[0],
                }
            )
        )
    finally:
        for c in children:
            c.stop()
        cleanup.run()
        r.close()


def local_redis_pid(r: BenchRedis) -> int | None:
    """The Redis server's process id when it runs on this machine (the ``process_id`` of its
    ``INFO server`` is a ``redis-server`` here), else None."""
    pid = int(r.info("server").get("process_id", 0) or 0)
    return pid if pid and "redis-server" in cmdline(pid) else None


def where_time_went(before: tuple[float, float], after: tuple[float, float], span: float) -> list[float]:
    """``[on a core, waiting for one, asleep]`` seconds of a thread over ``span`` seconds, from two
    :func:`~benchmarks.procfs.sched_seconds` readings."""
    on_cpu, waiting = after[0] - before[0], after[1] - before[1]
    return [round(on_cpu, 3), round(waiting, 3), round(max(0.0, span - on_cpu - waiting), 3)]


def commands_per_trajectory(
    before: dict[str, Any], after: dict[str, Any], n: int, top: int = 6
) -> dict[str, list[float]]:
    """``{command: [calls, microseconds]}`` per trajectory between two ``INFO commandstats``, for the
    ``top`` commands by time."""
    return {
        name: [round(calls / n, 3), round(usec / n, 1)]
        for usec, calls, name in rewardq_bench.command_deltas(before, after)[:top]
    }


if __name__ == "__main__":
    main()
