"""Run a program in the local sandbox: one child process tree per job, never in the worker.

:class:`LocalSandbox` starts :mod:`~rewardq.reward.codeexec.harness` as an asyncio
subprocess (the event loop never blocks), feeds it one job and reads its report under a
wall-clock timeout and a byte cap. What isolates the program depends on what the machine
allows, detected once by :meth:`LocalSandbox.start` with a probe program:

``namespaces`` (the worker runs as root and ``unshare`` works)
    new mount, pid, network, IPC and UTS namespaces (util-linux ``unshare``); every mount
    read-only; ``/root``, ``/home`` and ``/run`` hidden (the interpreter and the virtualenv
    are bound back read-only when they live there); a private ``/tmp`` holding the work dir;
    the program runs as its own unprivileged uid with no new privileges, so it can signal
    nothing outside its run, read only world-readable files, write only its work dir, and
    reach no network (only a loopback that is down). Killing the ``unshare`` process kills the
    whole pid namespace.
``rlimits`` (anything else)
    the same child processes, rlimits, scrubbed environment, fresh work dir (removed
    afterwards) and no inherited descriptors, but as the worker's own user: the program can
    open network connections, read what the worker's user can read, and signal the worker's
    user's processes, and a process that leaves its process group (``setsid``) can outlive the
    run. The worker logs a warning naming this when it scores its first code response; use
    SandboxFusion or a host where namespaces work for untrusted code.

In both, each run's process gets: RLIMIT_AS = ``memory_limit_mb``, RLIMIT_CPU = the run's
deadline + 1 s, RLIMIT_FSIZE, RLIMIT_NPROC (per sandbox uid, so with namespaces only),
no core dumps, ``oom_score_adj`` 1000 (the kernel's first OOM victim), a scrubbed
environment, stdin/stdout/stderr on ``/dev/null``, its own process group, and a run
deadline after which its whole tree is killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewardq import defaults
from rewardq.errors import CodeSandboxError, ConfigError
from rewardq.reward.codeexec.cases import PREAMBLE_STAR_MODULES, prime_module_source
from rewardq.reward.codeexec.settings import ISOLATIONS

logger = logging.getLogger("rewardq.reward.codeexec")

HARNESS = str(Path(__file__).with_name("harness.py"))
#: What ``unshare`` creates for a job: everything but a user and a cgroup namespace.
UNSHARE_ARGS = ("--mount", "--uts", "--ipc", "--net", "--pid", "--fork", "--kill-child", "--mount-proc")
#: Imported by the supervisor before it forks runners, so no run pays for them.
PREIMPORT = PREAMBLE_STAR_MODULES
_STDERR_CAP = 65536
#: The isolation each requested mode resolved to in this process (the host does not change).
_DECIDED: dict[str, str] = {}


@dataclass(frozen=True)
class Program:
    """What one job runs: the module to execute and the inputs of its cases.

    Attributes:
        module: the module source (preamble included; see ``cases.prime_module_source``).
        fn_name: the function each case calls; None: each case calls ``code()`` on stdin.
        solution_class: call ``fn_name`` on ``Solution()`` instead of the module.
        inputs: every case's raw input (the runs name cases by index).
    """

    module: str
    fn_name: str | None
    solution_class: bool
    inputs: list[Any]


@dataclass(frozen=True)
class RunSpec:
    """One run: a fresh process runs ``cases`` in order, each under ``timeout`` seconds
    (``signal.alarm``), the whole run under ``deadline`` seconds."""

    cases: list[int]
    timeout: int
    deadline: float


@dataclass
class RunReport:
    """What one run reported: the runner's records in order, and how its process ended."""

    records: list[dict] = field(default_factory=list)
    exit: int | None = None
    signal: str | None = None
    timed_out: bool = False
    overflow: bool = False
    seconds: float = 0.0


@dataclass
class SandboxLimits:
    """Per-run limits (see the module docstring)."""

    memory_mb: int = defaults.CODE_MEMORY_LIMIT_MB
    file_mb: int = defaults.CODE_FILE_SIZE_MB
    processes: int = defaults.CODE_MAX_PROCESSES
    output_bytes: int = defaults.CODE_MAX_OUTPUT_BYTES


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask), not the host's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _scrubbed_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def exposed_paths(hidden: tuple[str, ...]) -> list[str]:
    """The interpreter's folders (``sys.prefix``, ``sys.base_prefix``: the stdlib and the
    virtualenv's site-packages) that lie under a hidden folder, outermost first, without
    nesting. Nothing else is bound back: not the worker's working directory, not ``PYTHONPATH``."""
    wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    under = sorted(
        {
            real
            for real in (os.path.realpath(p) for p in wanted)
            if any(real == h or real.startswith(h.rstrip("/") + "/") for h in hidden)
        }
    )
    out: list[str] = []
    for p in under:
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


class LocalSandbox:
    """Runs programs in isolated child processes; see the module docstring.

    Args:
        limits: per-run limits.
        isolation: ``"auto"`` (namespaces when the probe passes, else rlimits),
            ``"namespaces"`` (fail when unavailable) or ``"rlimits"``.
        max_concurrent: jobs at once in this process (default: the CPUs it may run on).
        hidden: folders covered by an empty tmpfs with namespaces.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: str = "auto",
        max_concurrent: int | None = None,
        hidden: tuple[str, ...] = defaults.CODE_HIDDEN_PATHS,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ConfigError(f"code_local_isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        self.limits = limits or SandboxLimits()
        self.requested = isolation
        self.isolation: str | None = None  # decided by start()
        self.hidden = hidden
        self.max_concurrent = max_concurrent or _usable_cpus()
        self._slots = asyncio.Semaphore(self.max_concurrent)
        self._start_lock = asyncio.Lock()
        self._unshare = shutil.which("unshare")

    # -- start-up ----------------------------------------------------------------------
    async def start(self) -> str:
        """Decide the isolation (once) with a probe program; returns it.

        Raises:
            CodeSandboxError: ``isolation="namespaces"`` was asked for and the probe failed, or
                even the ``rlimits`` probe failed (the interpreter cannot run the harness).
        """
        async with self._start_lock:
            if self.isolation is None:
                self.isolation = _DECIDED.get(self.requested) or await self._decide()
                _DECIDED[self.requested] = self.isolation
            return self.isolation

    async def _decide(self) -> str:
        """Probe namespaces (unless ``rlimits`` was asked for), then rlimits; the first that works."""
        reason = ""
        if self.requested in ("auto", "namespaces"):
            reason = await self._probe("namespaces")
            if not reason:
                logger.info("local code runner: namespaces (no network, read-only filesystem, own uid)")
                return "namespaces"
            if self.requested == "namespaces":
                raise CodeSandboxError(
                    f"the local code sandbox cannot use namespaces: {reason}. Run the worker as root "
                    "on a host (or a privileged container) where `unshare` works, set "
                    "code_local_isolation=rlimits to accept weaker isolation, or configure sandbox_fusion_url"
                )
        failure = await self._probe("rlimits")
        if failure:
            raise CodeSandboxError(f"the local code sandbox does not work on this host: {failure}")
        logger.warning(
            "local code runner: namespaces unavailable (%s); programs run with rlimits only, as the "
            "worker's user: they CAN open network connections, read files this user can read and "
            "signal this user's processes. Use sandbox_fusion_url or a host where namespaces work "
            "for untrusted code",
            reason or "not requested",
        )
        return "rlimits"

    async def _probe(self, isolation: str) -> str:
        """Run ``print(input())`` on ``ok`` with ``isolation``; "" when it worked, else why not."""
        if isolation == "namespaces":
            if os.geteuid() != 0:
                return "the worker is not running as root"
            if self._unshare is None:
                return "the `unshare` command (util-linux) is not installed"
        program = Program(prime_module_source("print(input())", None), None, False, ["ok"])
        try:
            report = await self._run(program, [RunSpec([0], 5, 10.0)], isolation)
        except CodeSandboxError as exc:
            return str(exc)
        records = report[0].records if report else []
        if [r for r in records if "case" in r] != [{"case": 0, "out": "ok\n"}]:
            return f"the probe program did not run as expected: {records!r:.300}"
        return ""

    # -- running ------------------------------------------------------------------------
    async def execute(self, program: Program, runs: list[RunSpec]) -> list[RunReport]:
        """Run ``program`` once per entry of ``runs``, each in a fresh process, in one sandbox.

        Raises:
            CodeSandboxError: the sandbox itself failed (not the program).
        """
        if not runs:
            return []
        isolation = await self.start()
        async with self._slots:
            return await self._run(program, runs, isolation)

    def _job(self, program: Program, runs: list[RunSpec], isolation: str, workdir: str | None) -> dict:
        uid = None
        if isolation == "namespaces":
            uid = defaults.CODE_SANDBOX_UID_BASE + random.randrange(defaults.CODE_SANDBOX_UID_COUNT)
        return {
            "isolation": isolation,
            "uid": uid,
            "workdir": workdir,
            "expose": exposed_paths(self.hidden) if isolation == "namespaces" else [],
            "hide": list(self.hidden),
            "limits": {
                "memory_mb": self.limits.memory_mb,
                "file_mb": self.limits.file_mb,
                "processes": self.limits.processes,
                "output_bytes": self.limits.output_bytes,
            },
            "module": program.module,
            "fn_name": program.fn_name,
            "solution_class": program.solution_class,
            "inputs": program.inputs,
            "runs": [{"cases": r.cases, "timeout": r.timeout, "deadline": r.deadline} for r in runs],
            "preimport": list(PREIMPORT),
        }

    async def _run(self, program: Program, runs: list[RunSpec], isolation: str) -> list[RunReport]:
        workdir = None if isolation == "namespaces" else tempfile.mkdtemp(prefix="rewardq-code-")
        try:
            job = json.dumps(self._job(program, runs, isolation, workdir)).encode()
            if isolation == "namespaces":
                assert self._unshare is not None
                cmd = [self._unshare, *UNSHARE_ARGS, "--", sys.executable, "-I", "-B", HARNESS]
                env = _scrubbed_env("/tmp/work")
            else:
                cmd = [sys.executable, "-I", "-B", HARNESS]
                env = _scrubbed_env(workdir or "/tmp")
            wall = sum(r.deadline for r in runs) + defaults.CODE_STARTUP_SLACK
            cap = len(runs) * (self.limits.output_bytes + 65536) + 65536
            out, err, code = await _invoke(cmd, env, job, wall, cap)
            return parse_report(out, err, code, len(runs))
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)


async def _invoke(cmd: list[str], env: dict[str, str], job: bytes, wall: float, cap: int) -> tuple[bytes, bytes, int]:
    """Start ``cmd`` in its own session, feed ``job``, read stdout (at most ``cap`` bytes) and
    stderr; kill the whole process group on the wall-clock timeout, on overflow and on cancellation."""
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd="/",
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def feed() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(job)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died early: its stderr and exit code say why
        finally:
            proc.stdin.close()

    async def read(stream: asyncio.StreamReader, limit: int) -> bytes:
        data = bytearray()
        while chunk := await stream.read(65536):
            data += chunk
            if len(data) > limit:
                raise CodeSandboxError(f"the local code sandbox printed more than {limit} bytes")
        return bytes(data)

    async def communicate() -> tuple[bytes, bytes]:
        assert proc.stdout is not None and proc.stderr is not None
        _, out, err = await asyncio.gather(feed(), read(proc.stdout, cap), read(proc.stderr, _STDERR_CAP))
        return out, err

    try:
        out, err = await asyncio.wait_for(communicate(), wall)
        code = await proc.wait()
    except asyncio.TimeoutError:
        raise CodeSandboxError(f"the local code sandbox did not finish within {wall:.0f}s") from None
    finally:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await asyncio.shield(proc.wait())
    return out, err, code


def parse_report(out: bytes, err: bytes, code: int, n_runs: int) -> list[RunReport]:
    """The harness's stdout as one :class:`RunReport` per run.

    Raises:
        CodeSandboxError: a setup error, a runner that could not isolate itself (the supervisor
            says so, on a pipe the program never holds), or fewer run reports than runs (the
            harness died); the message carries its stderr's tail.
    """
    reports: list[RunReport] = []
    current = RunReport()
    for line in out.decode("utf-8", "replace").split("\n"):
        kind, _, payload = line.partition(" ")
        if kind == "E":
            raise CodeSandboxError(f"the local code sandbox could not be set up: {_field(payload, 'setup_error')}")
        if kind == "R":
            try:
                record = json.loads(payload)
            except ValueError:
                continue  # a line the program garbled: it only loses its own records
            if isinstance(record, dict):
                current.records.append(record)
        elif kind == "S":
            st = json.loads(payload)
            if st.get("sandbox_error"):
                raise CodeSandboxError(f"the local code sandbox could not isolate a program: {st['sandbox_error']}")
            current.exit, current.signal = st.get("exit"), st.get("signal")
            current.timed_out, current.overflow = bool(st.get("timed_out")), bool(st.get("overflow"))
            current.seconds = float(st.get("seconds") or 0.0)
            reports.append(current)
            current = RunReport()
    if len(reports) != n_runs:
        tail = err.decode("utf-8", "replace").strip()[-800:]
        raise CodeSandboxError(
            f"the local code sandbox ended (exit code {code}) after {len(reports)} of {n_runs} runs"
            + (f": {tail}" if tail else "")
        )
    return reports


def _field(payload: str, name: str) -> str:
    try:
        return str(json.loads(payload).get(name, payload))
    except (ValueError, AttributeError):
        return payload
