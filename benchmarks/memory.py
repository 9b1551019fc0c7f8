"""Peak RSS of one rewardq worker with a small and with a large backlog.

For each backlog size (default 1,000 and 100,000 trajectories) a fresh namespace is filled
*before* the worker starts, then one worker scores the same number of trajectories
(``memory_process``, default 1,000) and its peak resident set (``VmHWM`` of
``/proc/<pid>/status``) is read. A worker whose memory followed the backlog (reading
everything pending, caching trajectories) would show it here; a bounded one (XREADGROUP
``COUNT``, ``concurrency`` trajectories in flight) shows the same peak for both.

The large backlog is ~70 KB per trajectory in Redis (~7 GB for 100,000). When the machine
has less than twice that available, the backlog is scaled down and the row says so.

**With images** (the ``memory+images`` row): the smaller backlog again, each trajectory's final
output carrying :data:`IMAGES` (a 336x336 PNG and a 336x336 JPEG, ~235 KB, as a vision-language
rollout's ``multi_modal_data`` holds them), scored by the same text-only manager. Against the row
without images of the same backlog it gives Redis memory per waiting trajectory with images, and
shows what a text-only scorer pays for images it never decodes (worker CPU and peak RSS).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from benchmarks.common import Cleanup, Row, Settings, connect, watch_drain
from benchmarks.procfs import mem_available_mb, status_kb
from benchmarks.rewardq_bench import done_count, fill, start_workers
from benchmarks.workload import Workload

#: Redis memory per trajectory of this workload (measured: ~68 KB of records + entry overhead).
MB_PER_TRAJECTORY = 0.075


#: The images each trajectory of the ``memory+images`` row carries on its final output: (side, format).
IMAGES = ((336, "PNG"), (336, "JPEG"))


def run(s: Settings, cleanup: Cleanup) -> list[Row]:
    rows = [one(s, cleanup, backlog) for backlog in s.backlogs]
    rows.append(one(s, cleanup, min(s.backlogs), images=True))
    return rows


def image_set(seed: int) -> list[bytes]:
    """:data:`IMAGES` as encoded bytes: smooth noise (a photo-like image, not a flat colour that
    compresses to nothing), deterministic."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng([seed, 0x1A6E])
    out = []
    for side, fmt in IMAGES:
        small = (rng.random((side // 8, side // 8, 3)) * 255).astype("uint8")
        buf = io.BytesIO()
        Image.fromarray(small).resize((side, side), Image.Resampling.BICUBIC).save(buf, fmt, quality=90)
        out.append(buf.getvalue())
    return out


class WithImages:
    """A workload trajectory whose final output carries ``images`` in its ``multi_modal_data``."""

    def __init__(self, traj: Any, images: list[bytes]) -> None:
        self.traj, self.images = traj, images
        self.uid, self.session_id = traj.uid, traj.session_id

    def sample(self) -> dict[str, Any]:
        result: dict[str, Any] = self.traj.sample()
        return result

    def outputs(self) -> list[dict[str, Any]]:
        outs = self.traj.outputs()
        outs[-1] = {**outs[-1], "multi_modal_data": {"images": self.images}}
        result: list[dict[str, Any]] = outs
        return result


def one(s: Settings, cleanup: Cleanup, backlog: int, images: bool = False) -> Row:
    ns = s.prefix(f"mem{backlog}{'img' if images else ''}")
    cleanup.add(f"{ns}:*")
    notes = []
    room = mem_available_mb() / 2.0
    per_trajectory = MB_PER_TRAJECTORY + (sum(len(b) for b in image_set(s.seed)) / 2**20 if images else 0.0)
    if backlog * per_trajectory > room:
        scaled = int(room / per_trajectory)
        notes.append(f"backlog scaled down from {backlog} (only {room * 2:.0f} MB available)")
        backlog = scaled
    r = connect(s.redis_url)
    worker = None
    try:
        before = int(r.info("memory")["used_memory"])
        t0 = time.perf_counter()
        trajs: Iterable[Any] = Workload(s.seed + 2, tag=f"mem{backlog}-").range(0, backlog)
        if images:
            pictures = image_set(s.seed)
            trajs = (WithImages(t, pictures) for t in trajs)
            notes.append(f"{len(pictures)} images ({sum(map(len, pictures)) / 1024:.0f} KB) on each final output")
        nt, no = fill(s.redis_url, ns, trajs)
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
            "memory+images" if images else "memory",
            1,
            backlog=nt,
            rss_mb=hwm,
            note="; ".join(notes),
            **d.row_fields(nt, no),
            extra={
                "redis_mb": grown_mb,
                "redis_kb_per_trajectory": grown_mb * 1024 / max(nt, 1),
                "fill_s": fill_s,
                "rss_now_mb": (rss_kb or 0) / 1024,
            },
        )
    finally:
        if worker is not None:
            worker.stop()
        r.close()
        cleanup.run([f"{ns}:*"])
