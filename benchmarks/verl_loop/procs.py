"""CPU time of process groups, read from ``/proc`` (:mod:`benchmarks.procfs`).

A group's CPU is, for each of its live processes, its own user+system time plus what its
waited-for children used (``cutime``/``cstime``): a code program or a math-verify process that
ran and exited still counts for the scorer that started it. Measured as differences between
two readings, so what ran before the first reading never counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from benchmarks.procfs import process_tree, stat_cpu


def group_cpu(roots: Iterable[int], *, with_reaped: bool = True) -> float:
    """CPU seconds of the trees under ``roots`` (see the module doc)."""
    total = 0.0
    seen: set[int] = set()
    for root in roots:
        for p in process_tree(root):
            if p in seen:
                continue
            seen.add(p)
            own, reaped = stat_cpu(p)
            total += own + (reaped if with_reaped else 0.0)
    return total


CpuReader = Callable[[], dict[str, float]]
