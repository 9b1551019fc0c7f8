"""What the benchmarks read of processes, from Linux's ``/proc`` (one reader for every benchmark).

psutil would do the same; reading the few files directly keeps the benchmarks free of a dependency
the product does not need, and each reading costs the measured machine one small ``read()``.
Every reader answers for a process that is gone (``None``, ``0`` or an empty result), since the
processes measured come and go while they are read.
"""

from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")

#: indexes into :func:`stat_fields` (``proc(5)``'s field number minus 3)
STATE, MINFLT, UTIME, STIME, CUTIME, CSTIME = 0, 7, 11, 12, 13, 14


def stat_fields(pid: int, tid: int | None = None) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` (or of thread ``tid``'s ``task/<tid>/stat``) after the
    command, whose parentheses may hold spaces; None when the process or thread is gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def ticks(fields: list[str], *indexes: int) -> float:
    """The sum of the clock-tick ``fields`` at ``indexes``, in seconds."""
    return sum(int(fields[i]) for i in indexes) / _TICK


def stat_cpu(pid: int) -> tuple[float, float]:
    """``(own, reaped children)`` CPU seconds (user + system) of ``pid``; ``(0, 0)`` when it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return 0.0, 0.0
    return ticks(fields, UTIME, STIME), ticks(fields, CUTIME, CSTIME)


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (0.0 when the process is gone)."""
    return stat_cpu(pid)[0]


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of ``pid``, by thread id."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return {}
    out: dict[int, float] = {}
    for tid in tids:
        fields = stat_fields(pid, tid)
        if fields is not None:
            out[tid] = ticks(fields, UTIME, STIME)
    return out


def sched_seconds(pid: int, tid: int | None = None) -> tuple[float, float]:
    """``(on a core, ready but waiting for one)`` seconds of thread ``tid`` of ``pid`` (its main
    thread by default), from ``/proc/<pid>/task/<tid>/schedstat``; ``(0, 0)`` when it is gone.

    The second figure is the time the scheduler kept a runnable thread off every core: on a machine
    whose cores are all busy it is where a drain's wall time goes that no CPU figure shows.
    """
    try:
        with open(f"/proc/{pid}/task/{pid if tid is None else tid}/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def children(pid: int) -> list[int]:
    """The live children of ``pid``, started by any of its threads (a thread that ends between the
    listing and the read of its ``children`` takes only its own children along)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def process_tree(root: int) -> list[int]:
    """``root`` and its live descendants."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children(pid))
    return out


def status_kb(pid: int, field_name: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (VmHWM, VmRSS), or None when gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def cmdline(pid: int) -> str:
    """The command line of ``pid``, its arguments joined by spaces ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def is_zombie(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie waiting for its parent, or gone)."""
    fields = stat_fields(pid)
    return fields is None or fields[STATE] == "Z"


def mem_available_mb() -> float:
    """The machine's ``MemAvailable`` in MB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    return float("inf")


def load() -> str:
    """The machine's load averages (``/proc/loadavg``), to print beside the numbers."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"
