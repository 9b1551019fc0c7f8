"""A cgroup per sandbox job: CPU, memory (swap included) and process limits, and the job's clock.

:meth:`CgroupHost.detect` finds, once per worker process, where it may make cgroups:

* **cgroup v2** with the ``cpu``, ``memory`` and ``pids`` controllers available to the
  worker's own cgroup: everything in one hierarchy. A cgroup that still holds processes cannot
  hand controllers to children ("no internal processes"); when the worker's own cgroup is the
  root of its cgroup namespace (a container) its processes move into a leaf ``rewardq-init``
  first, as container init systems do; anywhere else the operator delegates a cgroup.
* **cgroup v1** with the ``cpu``, ``memory`` and ``pids`` hierarchies writable (as root),
  ``cpuacct`` for the job's CPU time (the job's clock, ``harness_cgroup``), and the v2
  ``unified`` mount when there is one (a "hybrid" host: its ``cgroup.kill`` ends a job at
  once, and its ``cpu.stat`` stands in for a missing ``cpuacct``).

Each job's cgroup, ``<worker's own cgroup>/rewardq-<pid>/job-<n>`` in each hierarchy, gets
``memory_limit_mb`` + 64 MB of memory with no swap (v2 ``memory.swap.max`` 0, v1
``memory.memsw.limit_in_bytes`` = the memory limit, or ``swappiness`` 0 where swap is not
accounted), ``pids.max`` = the process limit + 2, a quota of one CPU and the default CPU
weight (the same for every job, whatever number of processes it runs: its "CPU share"). The
harness's supervisor joins it before any program exists (``harness_cgroup.join``), so every
process of the job is inside and counted. :meth:`JobCgroup.destroy` kills what is left and
removes it; a worker that died leaves ``rewardq-<pid>`` folders that the next one on the host
removes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass
from itertools import count

from rewardq.errors import CodeSandboxError

#: Local runner: CPUs one job may use at once (its cgroup's quota), and its CPU weight
#: (equal for every job, whatever number of processes it runs).
CODE_JOB_CPUS = 1.0
#: Local runner: tries at killing the processes left in a job's cgroup and removing it (~10 ms apart).
CODE_CGROUP_KILL_ATTEMPTS = 100
#: Local runner: jobs a worker's cgroup parent is weighted as when nobody says how many it runs.
CODE_CGROUP_JOBS = 1


logger = logging.getLogger("rewardq.reward.codeexec")

CONTROLLERS = ("cpu", "memory", "pids")
_PERIOD_US = 100_000
_JOB_NUMBERS = count()  # one sequence per process: every CgroupHost of it shares the parent folders


@dataclass(frozen=True)
class JobLimits:
    """What one job's cgroup allows."""

    memory_bytes: int
    pids: int
    cpus: float = CODE_JOB_CPUS


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """``(root, mount point, fstype, super options)`` of every cgroup mount."""
    out = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return out


def _own_paths(proc_cgroup: str) -> dict[str, str]:
    """``{controller or "": path}`` from ``/proc/self/cgroup`` ("" is the v2 hierarchy)."""
    out = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c.removeprefix("name=")] = path
    return out


def _under(mount_point: str, mount_root: str, path: str) -> str:
    rel = os.path.relpath(path, mount_root) if mount_root != "/" else path.lstrip("/")
    return os.path.normpath(os.path.join(mount_point, "" if rel == "." else rel))


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


@dataclass
class JobCgroup:
    """One job's cgroup, in one or more hierarchies (see the module docstring)."""

    dirs: list[str]
    v2_dir: str | None
    cpu_usage: str | None

    def harness_fields(self) -> dict[str, object]:
        """What the harness needs: the ``cgroup.procs`` files to join and the clock's files."""
        return {
            "procs": [os.path.join(d, "cgroup.procs") for d in self.dirs],
            "cpu_usage": self.cpu_usage,
        }

    def _pids(self) -> set[int]:
        pids: set[int] = set()
        for d in self.dirs:
            try:
                pids.update(int(p) for p in _read(os.path.join(d, "cgroup.procs")).split())
            except (OSError, ValueError):
                pass
        return pids

    async def destroy(self, attempts: int = CODE_CGROUP_KILL_ATTEMPTS) -> None:
        """Kill every process still in the job's cgroup and remove it (waits up to ~1 s)."""
        for _ in range(attempts):
            if self.v2_dir and os.path.exists(os.path.join(self.v2_dir, "cgroup.kill")):
                try:
                    _write(os.path.join(self.v2_dir, "cgroup.kill"), "1")
                except OSError:
                    pass
            for pid in self._pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            left: list[str] = []
            for d in self.dirs:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(d)
            self.dirs = left
            if not left:
                return
            await asyncio.sleep(0.01)
        logger.warning("local code runner: could not remove the job cgroups %s (processes still exiting)", left)


@dataclass
class CgroupHost:
    """Where this worker process makes job cgroups (see the module docstring)."""

    version: int
    parents: dict[str, str]  # hierarchy key ("cpu", "memory", "pids", "cpuacct", "unified") -> this worker's folder

    @classmethod
    def detect(cls, *, jobs: int = CODE_CGROUP_JOBS, proc_root: str = "/proc") -> CgroupHost:
        """The hierarchies this process can use, with a parent folder made in each, weighted as
        ``jobs`` processes (each job then competes with the host's other processes as one
        process would, however many are in its parent).

        Raises:
            CodeSandboxError: no writable cgroup with the cpu, memory and pids controllers; the
                message says what to change.
        """
        try:
            mounts = _mounts(_read(f"{proc_root}/self/mountinfo"))
            own = _own_paths(_read(f"{proc_root}/self/cgroup"))
        except OSError as exc:
            raise CodeSandboxError(f"cannot read this process's cgroups ({exc})") from None
        v2 = next(((root, point) for root, point, kind, _ in mounts if kind == "cgroup2"), None)
        v2_dir = _under(v2[1], v2[0], own.get("", "/")) if v2 else None
        if v2_dir and set(CONTROLLERS) <= set(_read_quiet(os.path.join(v2_dir, "cgroup.controllers")).split()):
            return cls._v2(v2_dir, own.get("", "/"), jobs)
        v1: dict[str, str] = {}
        for root, point, kind, options in mounts:
            for c in ("cpu", "memory", "pids", "cpuacct"):
                if kind == "cgroup" and c in options and c in own:
                    v1.setdefault(c, _under(point, root, own[c]))
        missing = [c for c in CONTROLLERS if c not in v1]
        if missing:
            raise CodeSandboxError(
                f"no cgroup with the {', '.join(missing)} controller(s) is available to this worker "
                "(it needs cgroup v2 with cpu, memory and pids enabled for its cgroup, or writable v1 "
                "cpu, memory and pids hierarchies); in a container mount /sys/fs/cgroup read-write "
                "(see docs/code-execution.md)"
            )
        if v2_dir:
            v1["unified"] = v2_dir
        host = cls._made(1, v1)
        _write(os.path.join(host.parents["cpu"], "cpu.shares"), str(1024 * max(1, jobs)))
        return host

    @classmethod
    def _v2(cls, own_dir: str, own_path: str, jobs: int) -> CgroupHost:
        enable = " ".join(f"+{c}" for c in CONTROLLERS)
        wanted = set(CONTROLLERS)
        if not wanted <= set(_read_quiet(os.path.join(own_dir, "cgroup.subtree_control")).split()):
            try:
                _write(os.path.join(own_dir, "cgroup.subtree_control"), enable)
            except OSError as exc:
                if own_path != "/":
                    raise CodeSandboxError(
                        f"cannot enable the cpu, memory and pids controllers below this worker's cgroup "
                        f"{own_dir} ({exc.strerror}): it holds processes, so give the worker a delegated "
                        "cgroup of its own (systemd: Delegate=yes) or run it in a container"
                    ) from None
                init = os.path.join(own_dir, "rewardq-init")  # the namespace's root: move its processes to a leaf
                os.makedirs(init, exist_ok=True)
                for pid in _read(os.path.join(own_dir, "cgroup.procs")).split():
                    try:
                        _write(os.path.join(init, "cgroup.procs"), pid)
                    except OSError:
                        pass  # a kernel thread or a process that exited
                try:
                    _write(os.path.join(own_dir, "cgroup.subtree_control"), enable)
                except OSError as exc2:
                    raise CodeSandboxError(
                        f"cannot enable the cpu, memory and pids controllers in {own_dir} ({exc2.strerror})"
                    ) from None
        host = cls._made(2, {"unified": own_dir})
        try:
            _write(os.path.join(host.parents["unified"], "cgroup.subtree_control"), enable)
            _write(os.path.join(host.parents["unified"], "cpu.weight"), str(min(10000, 100 * max(1, jobs))))
        except OSError as exc:
            raise CodeSandboxError(f"cannot enable the cpu, memory and pids controllers ({exc})") from None
        return host

    @classmethod
    def _made(cls, version: int, bases: dict[str, str]) -> CgroupHost:
        parents = {}
        for key, base in bases.items():
            _remove_stale(base)
            parent = os.path.join(base, f"rewardq-{os.getpid()}")
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as exc:
                raise CodeSandboxError(
                    f"cannot make a cgroup in {base} ({exc.strerror}): the worker must run as root with a "
                    "writable /sys/fs/cgroup (see docs/code-execution.md)"
                ) from None
            parents[key] = parent
        return cls(version, parents)

    def create(self, limits: JobLimits) -> JobCgroup:
        """A new job cgroup with ``limits``.

        Raises:
            CodeSandboxError: the kernel refused a folder or a limit.
        """
        name = f"job-{next(_JOB_NUMBERS)}"
        made: list[str] = []
        try:
            for key in sorted(self.parents):
                path = os.path.join(self.parents[key], name)
                os.mkdir(path)
                made.append(path)
            job = JobCgroup(list(made), None, None)
            if self.version == 2:
                d = made[0]
                job.v2_dir, job.cpu_usage = d, os.path.join(d, "cpu.stat")
                _write(os.path.join(d, "cpu.max"), f"{int(_PERIOD_US * limits.cpus)} {_PERIOD_US}")
                _write(os.path.join(d, "cpu.weight"), "100")
                _write(os.path.join(d, "memory.max"), str(limits.memory_bytes))
                _write(os.path.join(d, "memory.swap.max"), "0")
                _write(os.path.join(d, "pids.max"), str(limits.pids))
                return job
            by_key = dict(zip(sorted(self.parents), made))
            cpu, memory = by_key["cpu"], by_key["memory"]
            _write(os.path.join(cpu, "cpu.cfs_period_us"), str(_PERIOD_US))
            _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(int(_PERIOD_US * limits.cpus)))
            _write(os.path.join(cpu, "cpu.shares"), "1024")
            _write(os.path.join(memory, "memory.limit_in_bytes"), str(limits.memory_bytes))
            memsw = os.path.join(memory, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):
                _write(memsw, str(limits.memory_bytes))
            else:
                _write(os.path.join(memory, "memory.swappiness"), "0")
            _write(os.path.join(by_key["pids"], "pids.max"), str(limits.pids))
            job.v2_dir = by_key.get("unified")
            if "cpuacct" in by_key:
                job.cpu_usage = os.path.join(by_key["cpuacct"], "cpuacct.usage")
            elif job.v2_dir and os.path.exists(os.path.join(job.v2_dir, "cpu.stat")):
                job.cpu_usage = os.path.join(job.v2_dir, "cpu.stat")
            return job
        except OSError as exc:
            for path in made:
                try:
                    os.rmdir(path)
                except OSError:
                    pass
            raise CodeSandboxError(f"cannot set up the job's cgroup ({exc})") from None


def _read_quiet(path: str) -> str:
    try:
        return _read(path)
    except OSError:
        return ""


def _remove_stale(base: str) -> None:
    """Remove the ``rewardq-<pid>`` folders of worker processes that no longer run."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        pid = name.removeprefix("rewardq-")
        if not name.startswith("rewardq-") or not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        parent = os.path.join(base, name)
        for child in _listdir(parent):
            _kill_and_remove(os.path.join(parent, child))
        try:
            os.rmdir(parent)
        except OSError:
            pass


def _listdir(path: str) -> list[str]:
    try:
        return [e.name for e in os.scandir(path) if e.is_dir()]
    except OSError:
        return []


def _kill_and_remove(path: str) -> None:
    for pid in _read_quiet(os.path.join(path, "cgroup.procs")).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
