"""The sandbox side of the local code runner: runs where the model's program runs, never in the worker.

Started by :mod:`rewardq.reward.codeexec.sandbox` as ``python -I -B harness.py`` (under
``unshare`` when namespaces are on). It reads one job (JSON) on stdin and writes its report
on stdout. It imports only the standard library, never rewardq.

Two roles:

* **supervisor** (this process; with namespaces it is pid 1 of a fresh pid namespace and still
  root): sets up the filesystem the program sees (:mod:`.harness_fs`), then for each run forks a runner, collects
  the runner's records under the run's deadline and a byte cap, kills whatever the runner left
  behind, and reports. The program cannot signal it (another uid) or reach its stdout.
* **runner** (one fork per run, so every run starts from a clean interpreter as ``prime_code``'s
  fresh processes do): drops to the sandbox uid, applies the rlimits, disables what
  ``prime_code``'s ``reliability_guard`` disables, loads the program and runs the run's cases,
  writing one JSON record per case. It reports what the program printed or returned, never a
  verdict: the expected outputs are not in this process.

Report lines (stdout)::

    R <runner record>     {"load_error"} | {"case", "out"} | {"case", "value"} | {"case", "error"}
                          | {"case", "abort"} | {"done"}; assert_case runs: {"case", "ran", "asserts",
                          "held", "out", ...} | {"tripwire", "detail"}. The runner writes each after
                          the run's token (drawn here per run, before the fork); lines without it
                          are dropped and counted in the status's "forged"
    S <run status>        {"exit", "signal", "timed_out", "overflow", "seconds", "sandbox_error", "forged"}, after
                          its records; ``sandbox_error`` says why the runner could not isolate itself
    E <setup error>       {"setup_error"}: the sandbox could not be built (not the program's fault)
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import select
import signal
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

# -- prctl(2) ---------------------------------------------------------------------------------
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 4, 38, 36

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def _sibling(name: str) -> Any:
    """A sibling module of this file (``harness_fs``, ``harness_guard``, ``harness_cgroup``),
    loaded by its path: this file runs as a script, and its own folder is not on ``sys.path``."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"rewardq_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the runner ------------------------------------------------------------------------------
program = _sibling("harness_program")


_quote = __import__("_json").encode_basestring_ascii  # C: a JSON string literal, ASCII only


def _encode(record: dict[str, object], quote: Callable[[str], str] = _quote) -> str:
    """``record`` (flat: text, integers, booleans) as ASCII JSON, with C functions only: nothing the
    program can replace (``json.dumps`` reads module globals it could swap) builds a report."""
    parts = []
    for key, value in record.items():
        if isinstance(value, str):
            text = quote(value)
        elif value is True or value is False:
            text = "true" if value else "false"
        else:
            text = f"{value:d}"
        parts.append(quote(key) + ":" + text)
    return "{" + ",".join(parts) + "}"


class _Records:
    """JSON lines on the pipe to the supervisor, each after the run's ``token`` (the supervisor
    drops and reports every line without it), at most ``cap`` bytes in all (the run's share of
    the output limit): what the program printed is bounded here, at the source."""

    def __init__(self, fd: int, cap: int, token: str) -> None:
        self.fd = fd
        self.left = cap
        self.token = token
        self._write = os.write
        self._prefix = (token + " ").encode("ascii")

    def emit(self, record: dict[str, object]) -> dict[str, Any]:
        """Write ``record``, or ``{"case", "overflow"}`` in its place when it does not fit; returns what was written."""
        data = self._prefix + (_encode(record) + "\n").encode("ascii")
        if len(data) > self.left - 256 and "case" in record:
            record = {"case": record["case"], "overflow": True}
            data = self._prefix + (_encode(record) + "\n").encode("ascii")
        self.left -= len(data)
        while data:
            data = data[self._write(self.fd, data) :]
        return record


def _oom_first() -> None:
    """``oom_score_adj`` 1000 (the kernel's first victim, not the worker or Redis), checked:
    written while still privileged, so the program cannot lower it again."""
    with open("/proc/self/oom_score_adj") as f:
        value = f.read().strip()
    if value != "1000":
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        with open("/proc/self/oom_score_adj") as f:
            value = f.read().strip()
    if value != "1000":
        raise OSError(f"oom_score_adj is {value}, not 1000")


def _isolate_runner(job: dict[str, Any], run: dict[str, Any], keep: tuple[int, ...], workdir: str, guard: Any) -> str:
    """Own process group, parent-death signal, stdio on /dev/null, no fds but ``keep``,
    ``oom_score_adj`` 1000, the sandbox uid, no new privileges, the work dir, the rlimits,
    Landlock (``rlimits`` mode), the syscall filter. Returns what confines it, for the report."""
    os.setpgid(0, 0)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    for name in os.listdir("/proc/self/fd"):
        n = int(name)
        if n > 2 and n not in keep:
            try:
                os.close(n)
            except OSError:
                pass
    _oom_first()
    uid = job.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.chdir(workdir)
    os.umask(0o022)
    limits = job["limits"]
    memory = int(limits["memory_mb"]) * 1024 * 1024
    file_size = int(limits["file_mb"]) * 1024 * 1024
    cpu = int(math.ceil(run["deadline"] * job["wall_factor"])) + 1
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if uid is not None:  # counted per uid: only meaningful for the job's own uid
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversize write raises OSError instead of killing
    confined = ["seccomp"]
    if job.get("tests") is not None:  # a signal to itself ends the run as SIGSYS: the worker sees early_exit
        guard.filter.deny_self_signals(os.getpid())
    if job["isolation"] == "rlimits":
        abi = guard.restrict_paths([*job["read_paths"], *job["library"]], [workdir])
        confined.append(f"landlock {abi}" if abi else "no landlock")
    guard.filter.load()
    return ", ".join(confined)


def run_program(
    job: dict[str, Any], run: dict[str, Any], fd: int, isolated_fd: int, workdir: str, guard: ModuleType, token: str
) -> None:
    """The runner: isolate, load the program, run the cases, report; never returns.

    Whether isolation worked goes on ``isolated_fd`` (``ok``, or why not), which is closed
    before any of the program runs: the program cannot forge a sandbox failure. No timer runs
    here: the supervisor measures the job's time and ends the run (see ``harness_cgroup``).
    """
    out = _Records(fd, int(job["limits"]["output_bytes"]), token)
    _exit = os._exit
    try:
        confined = _isolate_runner(job, run, (fd, isolated_fd), workdir, guard)
    except Exception as exc:  # noqa: BLE001 - the sandbox, not the program, failed: the worker must know
        _write(isolated_fd, f"{type(exc).__name__}: {exc}".encode("utf-8", "replace"))
        _exit(71)
    _write(isolated_fd, b"ok " + confined.encode())
    os.close(isolated_fd)
    if job.get("tests") is not None:
        trip = lambda name, detail: out.emit({"tripwire": name, "detail": detail[:500]})  # noqa: E731
        wires = guard.wires.Wires(trip, *guard.trusted)
        guard.asserts.run_case(job, run, out, workdir, wires, program.Capture, guard.compiler.compile_tests)
    call_based = job["fn_name"] is not None
    program.reliability_guard()
    try:
        method = program.load(job)
    except Exception as exc:  # noqa: BLE001 - a program that does not load is a compile error
        out.emit({"load_error": program.describe(exc)})
        _exit(0)
    except BaseException as exc:  # noqa: BLE001 - SystemExit at import: prime_code's process ends
        out.emit({"case": run["cases"][0] if run["cases"] else -1, "abort": program.describe(exc)})
        _exit(0)
    out.emit({"loaded": True})
    for i in run["cases"]:
        raw = job["inputs"][i]
        try:
            if not isinstance(raw, str):
                raise TypeError(f"input must be text, got {type(raw).__name__}")
            args = program.call_args(raw) if call_based else None
        except Exception as exc:  # noqa: BLE001 - prime_code's whole run dies on such an input
            out.emit({"case": i, "abort": program.describe(exc)})
            _exit(0)
        try:
            result = (
                program.call_case(method, args)
                if args is not None
                else program.stdin_case(method, raw, out.left - 1024)
            )
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt end prime_code's process
            out.emit({"case": i, "abort": program.describe(exc)})
            _exit(0)
        if "overflow" in out.emit({"case": i, **result}):  # a failed case ends what prime_code judges of this run
            break
    out.emit({"done": True})
    _exit(0)


# -- the supervisor --------------------------------------------------------------------------
def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _report(kind: str, payload: object) -> None:
    _write(1, kind.encode() + b" " + json.dumps(payload).encode() + b"\n")


def _collect(
    pid: int, fd: int, run: dict[str, Any], clock: Any, wall_factor: float, cap: int
) -> tuple[bytearray, bool, bool]:
    """Read the runner's records until it exits, its time runs out or more than ``cap`` bytes arrived.

    Time is the job's own (``clock``, see ``harness_cgroup``): the run may take ``deadline``
    seconds, each step of it (loading the program, then each case: one record line each) at
    most ``timeout``; the wall clock stops it at ``wall_factor`` times the deadline whatever
    the job's time says. Returns ``(data, timed_out, overflow)``. The runner is not reaped here
    (``WNOWAIT``).
    """
    timeout, deadline = float(run["timeout"]), float(run["deadline"])
    hard = deadline * wall_factor
    try:
        pidfd: int | None = os.pidfd_open(pid)  # readable once the runner exits: no polling
    except (AttributeError, OSError):
        pidfd = None
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    data, pipe_open, step = bytearray(), True, 0.0
    try:
        while True:
            now = clock.now()
            left = min(deadline - now, timeout - (now - step), hard - clock.wall())
            if left <= 0:
                return data, True, False
            # job time never runs faster than one CPU, so nothing can expire before ``left`` has passed
            for ready, _ in poller.poll(max(left if pidfd is not None else min(left, 0.05), 0.005) * 1000):
                if ready == fd and pipe_open:
                    chunk = os.read(fd, 65536)
                    data += chunk
                    if not chunk:  # every writer closed the pipe
                        poller.unregister(fd)
                        pipe_open = False
                    elif b"\n" in chunk:
                        step = clock.now()
            if len(data) > cap:
                return data, False, True
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                os.set_blocking(fd, False)  # its children may hold the pipe open: take what is there
                while pipe_open and len(data) <= cap:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        break
                    if not chunk:
                        break
                    data += chunk
                return data, False, len(data) > cap
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _descendants() -> list[int]:
    """Every process whose chain of parents leads to this one (a scan of ``/proc``)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
                parents[int(name)] = int(stat.rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    me, found = os.getpid(), []
    for pid in parents:
        p, hops = pid, 0
        while p in parents and p != me and hops < 4096:
            p, hops = parents[p], hops + 1
        if p == me and pid != me:
            found.append(pid)
    return found


def _end_run(pid: int) -> int:
    """Kill the runner and everything it started; reap. Returns the runner's wait status.

    As pid 1 of the job's pid namespace, ``kill(-1)`` reaches every process in it. Otherwise
    (``rlimits``) this process is a child subreaper: whatever the program started, even after
    ``setsid``, is a descendant, and is killed until none is left.
    """
    if os.getpid() == 1:
        os.kill(-1, signal.SIGKILL)
    else:
        for victim in [pid, *_descendants()]:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _, status = os.waitpid(pid, 0)
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):  # children left, none exited yet
                for victim in _descendants():
                    try:
                        os.kill(victim, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.005)
        except ChildProcessError:
            break
    return status


def _read_all(fd: int, deadline: float, limit: int = 4096) -> bytes:
    """What the runner writes on its isolation pipe, until it closes it (or the deadline)."""
    data = b""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while len(data) < limit:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            break
        chunk = os.read(fd, limit)
        if not chunk:
            break
        data += chunk
    return data


class _Budget:
    """What the job may still send the worker, ``R`` prefixes included (the job's share of the
    output limit): a flood of tiny lines, run after run, cannot pass it."""

    def __init__(self, total: int) -> None:
        self.left = total

    def forward(self, data: bytes, token: bytes) -> tuple[bool, int]:
        """Report the complete lines of ``data`` that carry the run's ``token`` as ``R`` lines,
        without it. Returns ``(fits, forged)``: False when some did not fit, and how many lines
        came without the token (the program wrote them on the pipe: they go no further)."""
        complete = data[: data.rfind(b"\n") + 1]  # a line cut off by a kill or a cap is not a record
        prefix, forged = token + b" ", 0
        for line in complete.split(b"\n"):
            if not line:
                continue
            if not line.startswith(prefix):
                forged += 1
                continue
            line = line[len(prefix) :]
            self.left -= len(line) + 3
            if self.left < 0:
                return False, forged
            _write(1, b"R " + line + b"\n")
        return True, forged


def supervise(
    job: dict[str, Any], run: dict[str, Any], workdir: str, guard: ModuleType, clock: Any, budget: _Budget
) -> None:
    """One run: fork a runner, collect its records, report them and its status."""
    token = os.urandom(16).hex()  # on every record of the runner: the program never learns it
    r, w = os.pipe()
    ir, iw = os.pipe()
    started = time.monotonic()
    wall_factor = float(job["wall_factor"])
    clock.reset()
    pid = os.fork()
    if pid == 0:  # the runner
        os.close(r)
        os.close(ir)
        try:
            run_program(job, run, w, iw, workdir, guard, token)
        finally:
            os._exit(70)
    os.close(w)
    os.close(iw)
    isolated = _read_all(ir, started + float(run["deadline"]) * wall_factor)
    os.close(ir)
    ok = isolated.startswith(b"ok ")
    cap = int(job["limits"]["output_bytes"]) + 4096
    data, timed_out, overflow = _collect(pid, r, run, clock, wall_factor, cap) if ok else (bytearray(), False, False)
    job_seconds = clock.now()
    status = _end_run(pid)
    os.close(r)
    fits, forged = budget.forward(bytes(data), token.encode())
    overflow = overflow or not fits
    _report(
        "S",
        {
            "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status) else None,
            "timed_out": timed_out,
            "overflow": overflow,
            "seconds": round(time.monotonic() - started, 6),
            "job_seconds": round(job_seconds, 6),
            "confined": isolated[3:].decode("utf-8", "replace") if ok else None,
            "sandbox_error": None if ok else isolated.decode("utf-8", "replace") or "no answer",
            "forged": forged,
        },
    )


def _prepare(job: dict[str, Any]) -> tuple[str, Any, Any]:
    """Everything before the first run: the cgroup, the filter, the filesystem, the imports.
    Returns ``(workdir, guard, clock)``."""
    cgroup_mod = _sibling("harness_cgroup")
    cgroup = job.get("cgroup")
    if cgroup:
        cgroup_mod.join(cgroup["procs"])  # before /sys turns read-only, before any runner exists
    if job["isolation"] == "rlimits":
        if job.get("uid") is None:  # the runners keep this uid, and undumpable they cannot write /proc/self
            _oom_first()
        _prctl(PR_SET_DUMPABLE, 0)  # same uid as the program: no /proc/<pid>/fd, mem or ptrace of this one
        _prctl(PR_SET_CHILD_SUBREAPER, 1)  # what the program starts stays a descendant, even after setsid
    guard = _sibling("harness_guard")
    guard.filter = guard.SyscallFilter()
    if job.get("tests") is not None:  # assert_case tests: their runner and its tripwires
        guard.asserts, guard.wires = _sibling("harness_asserts"), _sibling("harness_wires")
        guard.compiler = _sibling("harness_test_compiler")
        prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        library = sorted({*prefixes, *map(os.path.realpath, prefixes)})
        guard.trusted = (library, os.path.dirname(os.path.abspath(__file__)))
    # run-queue waits are read from /proc, which shows only the job's own processes with namespaces
    clock = cgroup_mod.JobClock(cgroup["cpu_usage"] if cgroup and job["isolation"] == "namespaces" else None)
    fs = _sibling("harness_fs")
    job["library"] = fs.interpreter_prefixes()  # what the programs' imports read (Landlock, ``rlimits``)
    workdir = fs.build_filesystem(job) if job["isolation"] == "namespaces" else job["workdir"]
    for name in job.get("preimport", ()):
        __import__(name)
    return workdir, guard, clock


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    job = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    try:
        workdir, guard, clock = _prepare(job)
    except Exception as exc:  # noqa: BLE001 - reported to the worker, which fails the trajectory
        _report("E", {"setup_error": f"{type(exc).__name__}: {exc}"})
        return 3
    budget = _Budget(int(job["limits"]["job_output_bytes"]))
    for run in job["runs"]:
        supervise(job, run, workdir, guard, clock, budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
