"""CPU time of process groups, read from ``/proc`` (no psutil).

A group's CPU is, for each of its live processes, its own user+system time plus what its
waited-for children used (``cutime``/``cstime``): a code program or a math-verify process that
ran and exited still counts for the scorer that started it. Measured as differences between
two readings, so what ran before the first reading never counts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from benchmarks.common import process_tree as tree

_TICK = os.sysconf("SC_CLK_TCK")


def stat_cpu(pid: int) -> tuple[float, float]:
    """``(own, reaped children)`` CPU seconds of ``pid``; ``(0, 0)`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK, (int(fields[13]) + int(fields[14])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def group_cpu(roots: Iterable[int], *, with_reaped: bool = True) -> float:
    """CPU seconds of the trees under ``roots`` (see the module doc)."""
    total = 0.0
    seen: set[int] = set()
    for root in roots:
        for p in tree(root):
            if p in seen:
                continue
            seen.add(p)
            own, reaped = stat_cpu(p)
            total += own + (reaped if with_reaped else 0.0)
    return total


CpuReader = Callable[[], dict[str, float]]


def load() -> str:
    """The machine's load averages (``/proc/loadavg``), to print beside the numbers."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"
