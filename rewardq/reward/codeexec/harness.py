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
                          | {"case", "abort"} | {"done"}
    S <run status>        {"exit", "signal", "timed_out", "overflow", "seconds", "sandbox_error"}, after
                          its records; ``sandbox_error`` says why the runner could not isolate itself
    E <setup error>       {"setup_error"}: the sandbox could not be built (not the program's fault)
"""

from __future__ import annotations

import ctypes
import io
import json
import math
import os
import resource
import select
import signal
import sys
import time
import types
from typing import Any

# -- prctl(2) ---------------------------------------------------------------------------------
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def _build_filesystem(job: dict) -> str:
    """With namespaces: :func:`harness_fs.build_filesystem`, loaded by its path (this file runs
    as a script, and its own folder is not on ``sys.path``)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness_fs.py")
    spec = importlib.util.spec_from_file_location("rewardq_harness_fs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_filesystem(job)


# -- the runner ------------------------------------------------------------------------------
class _Records:
    """JSON lines on the pipe to the supervisor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._write = os.write
        self._dumps = json.dumps

    def emit(self, record: dict) -> None:
        data = (self._dumps(record) + "\n").encode("utf-8", "surrogatepass")
        while data:
            data = data[self._write(self.fd, data) :]


def _isolate_runner(job: dict, run: dict, keep: tuple[int, ...], workdir: str) -> None:
    """Own process group, parent-death signal, stdio on /dev/null, no fds but ``keep``, the
    sandbox uid, no new privileges, the work dir, the rlimits."""
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
    try:
        with open("/proc/self/oom_score_adj", "w") as f:  # the kernel's first victim, not the worker
            f.write("1000")
    except OSError:
        pass
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
    cpu = int(math.ceil(run["deadline"])) + 1
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if uid is not None:  # counted per uid: only meaningful for the sandbox's own uid
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversize write raises OSError instead of killing


_OS_DISABLED = (
    "kill system putenv remove removedirs rmdir fchdir setuid fork forkpty killpg rename renames truncate "
    "replace unlink fchmod fchown chmod chown chroot lchflags lchmod lchown getcwd chdir"
).split()


def _reliability_guard() -> None:
    """What ``prime_code`` disables before it runs a program (so programs score the same);
    the isolation itself comes from the process, uid, namespaces and rlimits."""
    import builtins
    import faulthandler
    import shutil
    import subprocess

    faulthandler.disable()
    # the program under test must not reach these (as verl's prime_code harness disables them)
    builtins.exit = None  # type: ignore[assignment]  # disabled on purpose
    builtins.quit = None  # type: ignore[assignment]  # disabled on purpose
    builtins.help = None  # type: ignore[assignment]  # disabled on purpose
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in _OS_DISABLED:
        setattr(os, name, None)
    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, None)
    subprocess.Popen = None  # type: ignore[assignment,misc]  # disabled on purpose
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter", "subprocess", "ctypes"):
        sys.modules[name] = None  # type: ignore[assignment]  # None blocks the import on purpose


def _plain(value: Any) -> Any:
    """A returned value as tagged JSON data (see ``compare.decode_value``)."""
    if value is None or isinstance(value, bool):
        return None if value is None else bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        f = float(value)
        return f if math.isfinite(f) else {"f": repr(f)}
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return {"t": [_plain(v) for v in value]}
    if isinstance(value, dict):
        return {"d": [[_plain(k), _plain(v)] for k, v in value.items()]}
    raise TypeError(f"cannot report a {type(value).__name__}")


class _InputFile:
    """What ``open(...)`` returns while a standard-input program runs: the case's input again.

    ``prime_code`` patches ``builtins.open`` with ``unittest.mock.mock_open(read_data=input)``
    (a fresh read position on every call). A program reaches it only through
    ``builtins.open`` itself: the preamble's ``from builtins import *`` binds the real
    ``open`` in the program's own namespace. This small stand-in reads the same way and keeps
    ``unittest.mock`` (30 ms of imports) out of every sandbox.
    """

    def __init__(self, text: str) -> None:
        self._data = io.StringIO(text)

    def read(self, *args: Any) -> str:
        return self._data.read()

    def readline(self, *args: Any) -> str:
        return self._data.readline()

    def readlines(self, *args: Any) -> list[str]:
        return self._data.readlines()

    def __iter__(self) -> Any:
        return iter(self._data.readlines())

    def __enter__(self) -> _InputFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def write(self, data: Any) -> int:
        return len(data)

    def close(self) -> None:
        pass


def _call_stdin_program(method: Any, text: str) -> None:
    """Run ``code()`` with ``text`` as its standard input, as ``prime_code`` feeds it: for the
    call, ``sys.stdin`` is ``io.StringIO(text)`` and ``builtins.open`` opens that text again
    (what its stacked ``unittest.mock.patch`` decorators amount to); ``SystemExit`` ends the
    program normally."""
    import builtins

    real_stdin, real_open = sys.stdin, builtins.open
    sys.stdin = io.StringIO(text)
    builtins.open = lambda *args, **kwargs: _InputFile(text)  # type: ignore[assignment]  # stdin-only open()
    try:
        method()
    except SystemExit:
        pass
    finally:
        sys.stdin, builtins.open = real_stdin, real_open


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:2000]
    except MemoryError:  # the program used up its memory: keep the report small
        return type(exc).__name__


def _stdin_case(method: Any, text: str, timeout: int) -> dict:
    buf = io.StringIO()
    setattr(buf, "close", lambda x: 1)  # noqa: B010 - prime_code's capture: close(x) is a no-op taking one argument
    real = sys.stdout
    failure: Exception | None = None
    sys.stdout = buf
    signal.alarm(timeout)
    try:
        _call_stdin_program(method, text)
    except Exception as exc:  # noqa: BLE001 - the program's failure is the result
        failure = exc
    finally:
        signal.alarm(0)
        sys.stdout = real
    if failure is not None:
        io.StringIO.close(buf)  # free what it printed before building the report (MemoryError)
        return {"error": _describe(failure)}
    try:
        return {"out": buf.getvalue()}
    except MemoryError:  # as in prime_code, collecting the output fails and the whole run ends
        io.StringIO.close(buf)
        return {"abort": "MemoryError: its output does not fit in the memory limit"}


def _call_case(method: Any, args: list, timeout: int) -> dict:
    signal.alarm(timeout)
    try:
        value = method(*args)
        json.dumps(value)  # prime_code's check: an unserialisable result is a runtime error
        plain = json.dumps(_plain(value))
    except Exception as exc:  # noqa: BLE001 - the program's failure is the result
        signal.alarm(0)
        return {"error": _describe(exc)}
    signal.alarm(0)
    return {"value": plain}


def _call_args(raw: Any) -> list:
    args = [json.loads(line) for line in raw.split("\n")]
    try:
        if isinstance(args[0], dict):
            args = [{int(k): v for k, v in args[0].items()}]
    except Exception:  # noqa: BLE001 - prime_code leaves such arguments as they are
        pass
    return args


def _load(job: dict, timeout: int) -> Any:
    """Execute the program's module and find what each case calls (raises what the program raised)."""
    signal.alarm(timeout)
    try:
        module = types.ModuleType("tmp_sol")
        exec(compile(job["module"], "<string>", "exec"), module.__dict__)
        sys.modules["tmp_sol"] = module
        target = module.Solution() if job["solution_class"] else module
    finally:
        signal.alarm(0)
    return getattr(target, job["fn_name"] or "code")


def run_program(job: dict, run: dict, fd: int, isolated_fd: int, workdir: str) -> None:
    """The runner: isolate, load the program, run the cases, report; never returns.

    Whether isolation worked goes on ``isolated_fd`` (``ok``, or why not), which is closed
    before any of the program runs: the program cannot forge a sandbox failure.
    """
    out = _Records(fd)
    _exit = os._exit
    try:
        _isolate_runner(job, run, (fd, isolated_fd), workdir)
    except Exception as exc:  # noqa: BLE001 - the sandbox, not the program, failed: the worker must know
        _write(isolated_fd, f"{type(exc).__name__}: {exc}".encode())
        _exit(71)
    _write(isolated_fd, b"ok")
    os.close(isolated_fd)
    timeout = int(run["timeout"])
    call_based = job["fn_name"] is not None
    _reliability_guard()
    try:
        method = _load(job, timeout)
    except Exception as exc:  # noqa: BLE001 - a program that does not load is a compile error
        out.emit({"load_error": _describe(exc)})
        _exit(0)
    except BaseException as exc:  # noqa: BLE001 - SystemExit at import: prime_code's process ends
        out.emit({"case": run["cases"][0] if run["cases"] else -1, "abort": _describe(exc)})
        _exit(0)
    for i in run["cases"]:
        raw = job["inputs"][i]
        try:
            if not isinstance(raw, str):
                raise TypeError(f"input must be text, got {type(raw).__name__}")
            args = _call_args(raw) if call_based else None
        except Exception as exc:  # noqa: BLE001 - prime_code's whole run dies on such an input
            out.emit({"case": i, "abort": _describe(exc)})
            _exit(0)
        try:
            result = _call_case(method, args, timeout) if args is not None else _stdin_case(method, raw, timeout)
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt end prime_code's process
            out.emit({"case": i, "abort": _describe(exc)})
            _exit(0)
        out.emit({"case": i, **result})
    out.emit({"done": True})
    _exit(0)


# -- the supervisor --------------------------------------------------------------------------
def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _report(kind: str, payload: Any) -> None:
    _write(1, (kind + " " + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n").encode())


def _collect(pid: int, fd: int, deadline: float, cap: int) -> tuple[bytearray, bool, bool]:
    """Read the runner's records until it exits, the deadline passes or more than ``cap`` bytes arrived.

    Returns ``(data, timed_out, overflow)``. The runner is not reaped here (``WNOWAIT``).
    """
    try:
        pidfd: int | None = os.pidfd_open(pid)  # readable once the runner exits: no polling
    except (AttributeError, OSError):
        pidfd = None
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    data, pipe_open = bytearray(), True
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return data, True, False
            for ready, _ in poller.poll((left if pidfd is not None else min(left, 0.05)) * 1000):
                if ready == fd and pipe_open:
                    chunk = os.read(fd, 65536)
                    data += chunk
                    if not chunk:  # every writer closed the pipe
                        poller.unregister(fd)
                        pipe_open = False
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


def _end_run(pid: int) -> int:
    """Kill the runner and everything it started; reap. Returns the runner's wait status."""
    if os.getpid() == 1:  # pid 1 of the sandbox's own pid namespace: -1 means "every process in it"
        os.kill(-1, signal.SIGKILL)
    else:
        for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                kill()
            except ProcessLookupError:
                pass
    _, status = os.waitpid(pid, 0)
    if os.getpid() == 1:
        while True:
            try:
                os.waitpid(-1, 0)
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


def supervise(job: dict, run: dict, workdir: str) -> None:
    """One run: fork a runner, collect its records, report them and its status."""
    r, w = os.pipe()
    ir, iw = os.pipe()
    started = time.monotonic()
    deadline = started + float(run["deadline"])
    pid = os.fork()
    if pid == 0:  # the runner
        os.close(r)
        os.close(ir)
        try:
            run_program(job, run, w, iw, workdir)
        finally:
            os._exit(70)
    os.close(w)
    os.close(iw)
    isolated = _read_all(ir, deadline)
    os.close(ir)
    cap = int(job["limits"]["output_bytes"])
    data, timed_out, overflow = _collect(pid, r, deadline, cap) if isolated == b"ok" else (bytearray(), False, False)
    status = _end_run(pid)
    os.close(r)
    seconds = time.monotonic() - started
    budget = cap  # what reaches the worker, prefixes included: a flood of tiny lines cannot exceed it
    for line in bytes(data).split(b"\n"):
        if line:
            budget -= len(line) + 3
            if budget < 0:
                overflow = True
                break
            _report("R", line.decode("utf-8", "replace"))
    _report(
        "S",
        {
            "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status) else None,
            "timed_out": timed_out,
            "overflow": overflow,
            "seconds": round(seconds, 6),
            "sandbox_error": None if isolated == b"ok" else isolated.decode("utf-8", "replace") or "no answer",
        },
    )


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    job = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    try:
        workdir = _build_filesystem(job) if job["isolation"] == "namespaces" else job["workdir"]
        for name in job.get("preimport", ()):
            __import__(name)
    except Exception as exc:  # noqa: BLE001 - reported to the worker, which fails the trajectory
        _report("E", {"setup_error": f"{type(exc).__name__}: {exc}"})
        return 3
    for run in job["runs"]:
        supervise(job, run, workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
