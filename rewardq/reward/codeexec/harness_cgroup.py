"""The job's cgroup, seen from inside the sandbox: the supervisor joins it, and reads the job's
own clock from it. Loaded by path from :mod:`.harness` (standard library only).

The worker creates the cgroup (:mod:`rewardq.reward.codeexec.cgroups`) and names its files in
the job (``job["cgroup"]``). The supervisor writes itself into every ``cgroup.procs`` before
it builds the filesystem (which makes ``/sys`` read-only) and before it forks any runner, so
every process of the job is inside, with no way out.

**Job time.** A run's timeouts count the time the job itself was running or waiting for its
own reasons (sleeping, reading), not the time it waited for a CPU that others held: on a
loaded host, or beside a hostile job, a correct program must not time out. With the job's
CPU time (its cgroup) and, for every task of the job, the time it waited on a run queue
(``/proc/<pid>/task/<tid>/schedstat``, second field; the job's ``/proc`` shows only its own
processes)::

    job time = max(CPU time of the job's cgroup, wall time - the job's tasks' run-queue waits)

A single-threaded program gets exactly the time it would have on an idle machine (its CPU
time plus its sleeps); a job that runs many processes is charged the CPU they all use (at
most one CPU's worth per second: the cgroup's quota). The kernel's pressure-stall counters
(``cpu.pressure``) would be the natural source, but on the host this was built on they
missed a tenth of the waits that ``schedstat`` shows (15.4 s wall = 3.0 s run + 12.4 s
waiting; ``cpu.pressure`` counted 10.9 s). Without a cgroup the job time is the wall time,
as in verl. A hard wall-clock limit (``wall_factor`` times the deadline) bounds a starved
job either way.
"""

from __future__ import annotations

import os
import time


def join(procs_files: list[str]) -> None:
    """Move the calling process into each cgroup (one ``cgroup.procs`` per hierarchy)."""
    for path in procs_files:
        with open(path, "w") as f:
            f.write("0\n")  # "0": the writing process itself


def _read_int_field(path: str, field: str) -> int:
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == field:
                return int(parts[1])
    raise ValueError(f"{path} has no {field}")


def _run_queue_waits(exclude: int) -> float:
    """Seconds every live task in this ``/proc`` (the job's own) but ``exclude`` waited on a run queue."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == exclude:
            continue
        try:
            tids = os.listdir(f"/proc/{name}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{name}/task/{tid}/schedstat", "rb") as f:
                    total += int(f.read().split()[1])
            except (OSError, ValueError, IndexError):
                continue  # it exited meanwhile: its wait no longer counts
    return total / 1e9


class JobClock:
    """Seconds of job time (see the module docstring) since :meth:`reset`.

    Args:
        cpu_usage: a file with the cgroup's CPU time: ``cpu.stat`` (v2, ``usage_usec``) or
            ``cpuacct.usage`` (v1, nanoseconds); None: no cgroup, the job time is the wall time.
    """

    def __init__(self, cpu_usage: str | None) -> None:
        self.cpu_usage = cpu_usage
        self.waits = cpu_usage is not None and os.path.exists("/proc/self/schedstat")
        self._wall0 = self._cpu0 = 0.0
        self.reset()

    def _cpu(self) -> float:
        if self.cpu_usage is None:
            return 0.0
        if self.cpu_usage.endswith("cpu.stat"):
            return _read_int_field(self.cpu_usage, "usage_usec") / 1e6
        with open(self.cpu_usage) as f:
            return int(f.read().strip()) / 1e9

    def reset(self) -> None:
        """Start counting (before a run's runner exists: every task's wait then starts at 0)."""
        self._wall0, self._cpu0 = time.monotonic(), self._cpu()

    def wall(self) -> float:
        return time.monotonic() - self._wall0

    def now(self) -> float:
        wall = self.wall()
        if not self.waits:
            return wall
        return max(self._cpu() - self._cpu0, wall - _run_queue_waits(exclude=os.getpid()))
