"""Peak RSS of one rewardq worker with a small and with a large backlog.

For each backlog size (default 1,000 and 100,000 trajectories) a fresh namespace is filled
*before* the worker starts, then one worker scores the same number of trajectories
(``memory_process``, default 1,000) and its peak resident set (``VmHWM`` of
``/proc/<pid>/status``) is read. A worker whose memory followed the backlog (reading
everything pending, caching trajectories) would show it here; a bounded one (XREADGROUP
``COUNT``, ``concurrency`` trajectories in flight) shows the same peak for both.

The large backlog is ~70 KB per trajectory in Redis (~7 GB for 100,000). When the machine
has less than twice that available, the backlog is scaled down and the row says so.
"""

from __future__ import annotations

import time

from benchmarks.common import Cleanup, Row, Settings, connect, mem_available_mb, status_kb, watch_drain
from benchmarks.rewardq_bench import done_count, fill, start_workers
from benchmarks.workload import Workload

#: Redis memory per trajectory of this workload (measured: ~68 KB of records + entry overhead).
MB_PER_TRAJECTORY = 0.075


def run(s: Settings, cleanup: Cleanup) -> list[Row]:
    return [one(s, cleanup, backlog) for backlog in s.backlogs]


def one(s: Settings, cleanup: Cleanup, backlog: int) -> Row:
    ns = s.prefix(f"mem{backlog}")
    cleanup.add(f"{ns}:*")
    notes = []
    room = mem_available_mb() / 2.0
    if backlog * MB_PER_TRAJECTORY > room:
        scaled = int(room / MB_PER_TRAJECTORY)
        notes.append(f"backlog scaled down from {backlog} (only {room * 2:.0f} MB available)")
        backlog = scaled
    r = connect(s.redis_url)
    worker = None
    try:
        before = int(r.info("memory")["used_memory"])
        t0 = time.perf_counter()
        nt, no = fill(s.redis_url, ns, Workload(s.seed + 2, tag=f"mem{backlog}-").range(0, backlog))
        fill_s = time.perf_counter() - t0
        grown_mb = (int(r.info("memory")["used_memory"]) - before) / 2**20
        worker = start_workers(s, ns, 1, f"{s.run_id}-mem{backlog}")[0]
        worker.go()
        target = min(s.memory_process, nt)
        d = watch_drain(
            lambda: done_count(r, ns), target, s.memory_timeout, alive=worker.alive, snaps={"cpu": worker.cpu_seconds}
        )
        hwm = worker.peak_rss_mb()
        rss_kb = status_kb(worker.pid, "VmRSS")
        notes.append(
            f"{no} outputs waiting, Redis +{grown_mb:.0f} MB, filled in {fill_s:.0f}s; "
            f"RSS now {rss_kb / 1024 if rss_kb else float('nan'):.0f} MB"
        )
        return Row(
            "rewardq",
            "memory",
            1,
            backlog=nt,
            rss_mb=hwm,
            note="; ".join(notes),
            **d.row_fields(nt, no),
            extra={"redis_mb": grown_mb, "fill_s": fill_s, "rss_now_mb": (rss_kb or 0) / 1024},
        )
    finally:
        if worker is not None:
            worker.stop()
        r.close()
        cleanup.run([f"{ns}:*"])
