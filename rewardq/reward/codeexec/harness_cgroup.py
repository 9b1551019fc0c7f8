"""The job's cgroup, seen from inside the sandbox: the supervisor joins it, and reads the job's
own clock from it. Loaded by path from :mod:`.harness` (standard library only).

The worker creates the cgroup (:mod:`rewardq.reward.codeexec.cgroups`) and names its files in
the job (``job["cgroup"]``). The supervisor writes itself into every ``cgroup.procs`` before
it builds the filesystem (which makes ``/sys`` read-only) and before it forks any runner, so
every process of the job is inside, with no way out.

**Job time.** A run's timeouts count the time the job itself was running or waiting for its
own reasons (sleeping, reading), not the time it waited for a CPU that others held: on a
loaded host, or beside a hostile job, a correct program must not time out. With the
pressure-stall information of the job's cgroup (cgroup v2 ``cpu.pressure``, Linux 4.20+)::

    job time = max(CPU time of the job's cgroup, wall time - time some task of the job waited for a CPU)

A single-threaded program gets exactly the time it would have on an idle machine; a job that
runs many processes is charged the CPU they all use (at most one CPU's worth per second: the
cgroup's quota). Without pressure information the job time is the wall time, as in verl. A
hard wall-clock limit (``wall_factor`` times the deadline) bounds a starved job either way.
"""

from __future__ import annotations

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


def _read_some_total(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("some "):
                for item in line.split():
                    if item.startswith("total="):
                        return int(item[6:])
    raise ValueError(f"{path} has no 'some ... total='")


class JobClock:
    """Seconds of job time (see the module docstring) since :meth:`reset`.

    Args:
        cpu_usage: a file with the cgroup's CPU time: ``cpu.stat`` (v2, ``usage_usec``) or
            ``cpuacct.usage`` (v1, nanoseconds); None: CPU time is not known.
        pressure: the cgroup's ``cpu.pressure`` (v2); None: no stall information.
    """

    def __init__(self, cpu_usage: str | None, pressure: str | None) -> None:
        self.cpu_usage = cpu_usage
        self.pressure = pressure
        self._wall0 = self._cpu0 = self._stall0 = 0.0
        self.reset()

    def _cpu(self) -> float:
        if self.cpu_usage is None:
            return 0.0
        if self.cpu_usage.endswith("cpu.stat"):
            return _read_int_field(self.cpu_usage, "usage_usec") / 1e6
        with open(self.cpu_usage) as f:
            return int(f.read().strip()) / 1e9

    def _stall(self) -> float:
        return _read_some_total(self.pressure) / 1e6 if self.pressure else 0.0

    def reset(self) -> None:
        self._wall0, self._cpu0, self._stall0 = time.monotonic(), self._cpu(), self._stall()

    def wall(self) -> float:
        return time.monotonic() - self._wall0

    def now(self) -> float:
        wall = self.wall()
        if self.pressure is None:
            return wall
        return max(self._cpu() - self._cpu0, wall - (self._stall() - self._stall0))
