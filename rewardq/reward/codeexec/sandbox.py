"""Run a program in the local sandbox: one child process tree per job, never in the worker.

:class:`LocalSandbox` starts :mod:`~rewardq.reward.codeexec.harness` as an asyncio
subprocess (the event loop never blocks), feeds it one job and reads its report (bounded:
:mod:`.report`) under a wall-clock timeout and a byte cap. The isolation is decided once, by
:meth:`LocalSandbox.start`, and never silently weaker than the one asked for:

``namespaces`` (what ``auto`` means: the worker runs as root, ``unshare`` works, a cgroup
can be made)
    new mount, pid, network, IPC and UTS namespaces (util-linux ``unshare``); every mount
    read-only but the job's own ``/proc``; ``/root``, ``/home``, ``/run`` and every
    world-writable folder covered by an empty view (the interpreter and the virtualenv bound
    back read-only when they live there); a private ``/tmp`` holding the work dir; a uid that
    no other live job holds (:mod:`.uids`), no new privileges, the syscall filter
    (:mod:`.harness_guard`: no keyrings, no Unix sockets, no namespaces); its own cgroup
    (:mod:`.cgroups`: one CPU at most, the same CPU weight as every job, memory without
    swap, a process count), whose time its timeouts count (:mod:`.harness_cgroup`). Killing
    the ``unshare`` process kills the whole pid namespace.
``rlimits`` (only when asked for by name: ``code_local_isolation=rlimits``)
    no namespaces. As root: the same uid, cgroup and filter, but the host's filesystem and
    network. As any other user: the worker's own uid, Landlock (read only the interpreter
    and system libraries, write only the work dir, no TCP, no signals out), the filter,
    wall-clock timeouts. The worker logs a warning naming what is not isolated at every start.

With ``auto`` and no namespaces the sandbox refuses (:class:`~rewardq.errors.CodeSandboxError`
naming the fixes: root with the capabilities docs/code-execution.md lists, SandboxFusion, or
an explicit ``rlimits``), so code trajectories get an error result, never a reward computed
with less isolation than configured. It refuses too when a correct program cannot run in it,
or a program could read a worker secret (:mod:`.probe`): never a fake 0.0.

In both, each run's process gets: RLIMIT_AS = ``memory_limit_mb``, RLIMIT_CPU, RLIMIT_FSIZE,
RLIMIT_NPROC (per job uid), no core dumps, ``oom_score_adj`` 1000 (checked), a scrubbed
environment, stdin/stdout/stderr on ``/dev/null``, no inherited descriptors, its own process
group, output bounded where it is printed, and a run deadline after which its whole tree is
killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewardq.errors import CodeSandboxError, ConfigError
from rewardq.queue.states import FailureKind
from rewardq.reward.codeexec.cases import PREAMBLE_STAR_MODULES, prime_module_source
from rewardq.reward.codeexec.cgroups import CgroupHost, JobCgroup, JobLimits
from rewardq.reward.codeexec.harness_fs import outermost, world_writable
from rewardq.reward.codeexec.probe import FIXES, numpy_installed, probe_program, program_failure, static_refusal
from rewardq.reward.codeexec.report import CODE_MAX_OUTPUT_BYTES, RunReport, clean_text, parse_report
from rewardq.reward.codeexec.settings import ISOLATIONS, CodeExecSettings
from rewardq.reward.codeexec.uids import UidLease, UidPool

__all__ = ["FIXES", "HARNESS", "LocalSandbox", "Program", "RunReport", "RunSpec", "SandboxLimits", "parse_report"]

#: Local runner: largest file one program may write, in MB (RLIMIT_FSIZE).
CODE_FILE_SIZE_MB = 16
#: Local runner: processes the sandbox uid may have at once (RLIMIT_NPROC; bounds a fork bomb).
CODE_MAX_PROCESSES = 32
#: Local runner: bytes one job (all its runs) may send back to the worker.
CODE_MAX_JOB_OUTPUT_BYTES = 16 * 1024 * 1024
#: Local runner: a run's timeouts count the job's own time (see harness_cgroup); the wall
#: clock ends it at this many times its deadline whatever the job's time says (a job starved
#: of CPU by the host; past that, score_timeout gives an error result, never a wrong 0.0).
CODE_WALL_FACTOR = 10.0
#: Local runner: memory a job's cgroup allows beyond ``memory_limit_mb`` (the supervisor's own).
CODE_JOB_MEMORY_SLACK_MB = 64
#: Local runner: seconds allowed, on top of the runs' deadlines, to start and tear down a sandbox.
CODE_STARTUP_SLACK = 10.0
#: Local runner with namespaces: folders covered by an empty tmpfs (home folders, /run's
#: secrets, /var/tmp); every other world-writable folder found is covered too.
CODE_HIDDEN_PATHS = ("/root", "/home", "/run", "/var/tmp")


logger = logging.getLogger("rewardq.reward.codeexec")

HARNESS = str(Path(__file__).with_name("harness.py"))
#: What ``unshare`` creates for a job: everything but a user and a cgroup namespace.
UNSHARE_ARGS = ("--mount", "--uts", "--ipc", "--net", "--pid", "--fork", "--kill-child", "--mount-proc")
#: Imported by the supervisor before it forks runners, so no run pays for them.
PREIMPORT = PREAMBLE_STAR_MODULES
#: What a program may read under Landlock (``rlimits`` as another user than root), besides
#: the interpreter's own folders.
SYSTEM_READABLE = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/localtime")
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
        tests: ``assert_case`` mode: every case's test text, run after the program in the
            runner of :mod:`.harness_asserts` (``module`` is then the program as written); None:
            ``prime_code``'s mode.
    """

    module: str
    fn_name: str | None
    solution_class: bool
    inputs: list[Any]
    tests: list[str] | None = None


@dataclass(frozen=True)
class RunSpec:
    """One run: a fresh process runs ``cases`` in order, each under ``timeout`` seconds, the
    whole run under ``deadline`` seconds (job time: see :mod:`.harness_cgroup`)."""

    cases: list[int]
    timeout: int
    deadline: float


@dataclass
class SandboxLimits:
    """Per-job limits (see the module docstring)."""

    memory_mb: int = CodeExecSettings.sandbox_fusion_memory_limit_mb
    file_mb: int = CODE_FILE_SIZE_MB
    processes: int = CODE_MAX_PROCESSES
    output_bytes: int = CODE_MAX_OUTPUT_BYTES
    job_output_bytes: int = CODE_MAX_JOB_OUTPUT_BYTES


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


class LocalSandbox:
    """Runs programs in isolated child processes; see the module docstring.

    Args:
        limits: per-job limits.
        isolation: ``"auto"`` (namespaces, or refuse), ``"namespaces"`` (the same) or
            ``"rlimits"`` (weaker, on purpose).
        max_concurrent: jobs at once in this process (default: the CPUs it may run on).
        hidden: folders covered by an empty tmpfs with namespaces (world-writable folders are
            added when the sandbox starts).
        job_cgroups: give each job a cgroup (only benchmarks turn this off, to measure its cost).
        uids: where job uids come from (tests pass a pool with a lock folder of their own).
        secrets: the worker's secret files (the Redis URL file, the config file): covered in every
            job with namespaces; with ``rlimits`` the sandbox refuses to start while a program could
            read one (:func:`~rewardq.reward.codeexec.probe.static_refusal`).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: str = "auto",
        max_concurrent: int | None = None,
        hidden: tuple[str, ...] = CODE_HIDDEN_PATHS,
        job_cgroups: bool = True,
        uids: UidPool | None = None,
        secrets: tuple[str, ...] = (),
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ConfigError(f"code_local_isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        self.limits = limits or SandboxLimits()
        self.requested = isolation
        self.isolation: str | None = None  # decided by start()
        self.confined: str | None = None  # what the probe's runner reported confining it
        self.hidden = hidden
        self.secrets = tuple(os.path.abspath(p) for p in secrets if p)
        self.max_concurrent = max_concurrent or _usable_cpus()
        self.job_cgroups = job_cgroups
        self._slots = asyncio.Semaphore(self.max_concurrent)
        self._start_lock = asyncio.Lock()
        self._unshare = shutil.which("unshare")
        self._uids = uids or UidPool()
        self._cgroups: CgroupHost | None = None
        self._hid_world_writable = False
        self._refusal: str | None = None
        self.warned = False

    # -- start-up ----------------------------------------------------------------------
    def precheck(self) -> str:
        """Why namespaces cannot work here, from what is visible without running anything ("" when
        nothing is visibly missing, and always with ``rlimits``)."""
        if self.requested == "rlimits":
            return ""
        if os.geteuid() != 0:
            return "the worker is not running as root"
        if self._unshare is None:
            return "the `unshare` command (util-linux) is not installed"
        return ""

    async def start(self) -> str:
        """Decide the isolation (once) with a probe program; returns it.

        Raises:
            CodeSandboxError: namespaces were asked for (``auto`` or ``namespaces``) and do not
                work here, or even ``rlimits`` fails; the message names the fixes. Raised again
                on every later call: a refusal is final for this worker process.
        """
        async with self._start_lock:
            if self._refusal is not None:
                raise CodeSandboxError(self._refusal)
            if self.isolation is None:
                key = f"{self.requested}:{self.job_cgroups}"
                try:
                    refusal = static_refusal(self.requested, self.secrets, SYSTEM_READABLE)
                    if refusal:
                        raise CodeSandboxError(refusal)
                    decided = _DECIDED.get(key)
                    if decided is not None:
                        self._prepare_host(decided)  # the probe ran in another sandbox of this process
                    self.isolation = decided or await self._decide()
                except CodeSandboxError as exc:
                    self._refusal = str(exc)
                    raise
                _DECIDED[key] = self.isolation
            return self.isolation

    async def _decide(self) -> str:
        if self.requested in ("auto", "namespaces"):
            reason = self.precheck() or await self._isolates("namespaces")
            if reason:
                raise CodeSandboxError(
                    f"the local code sandbox refuses to run programs: namespaces are not available ({reason}). "
                    f"To score code here, {FIXES}"
                )
            await self._probe("namespaces")
            logger.info("local code runner: namespaces (%s, own uid, own cgroup, no network)", self.confined)
            return "namespaces"
        failure = await self._isolates("rlimits")
        if failure:
            raise CodeSandboxError(f"the local code sandbox does not work on this host: {failure}")
        await self._probe("rlimits")
        if not self.warned:
            self.warn_rlimits()
        return "rlimits"

    def warn_rlimits(self) -> None:
        """Log what ``rlimits`` leaves open here (the worker does at every start)."""
        self.warned = True
        logger.warning("%s", self.rlimits_warning())

    def _prepare_host(self, isolation: str) -> None:
        """The uid locks and the cgroups, once (both need root)."""
        if os.geteuid() != 0:
            return
        self._uids.check()
        if self.job_cgroups and self._cgroups is None:
            self._cgroups = CgroupHost.detect(jobs=self.max_concurrent)
        if isolation == "namespaces" and not self._hid_world_writable:
            self._hid_world_writable = True
            self.hidden = tuple(outermost([*self.hidden, *world_writable()]))

    async def _isolates(self, isolation: str) -> str:
        """Run ``print(input())`` on ``ok`` with ``isolation``; "" when it worked, else why not."""
        try:
            self._prepare_host(isolation)
            out = await self._run_probe(isolation, "print(input())")
        except CodeSandboxError as exc:
            return str(exc)
        return "" if out == "ok\n" else f"the probe program did not run as expected: {out}"

    async def _probe(self, isolation: str) -> None:
        """Run the probe program (:mod:`.probe`) as every job runs.

        Raises:
            CodeSandboxError: it did not print what a correct program prints here.
        """
        source, expected = probe_program(numpy_installed())
        out = await self._run_probe(isolation, source)
        if out != expected:
            raise CodeSandboxError(program_failure(out, isolation))

    async def _run_probe(self, isolation: str, source: str) -> str:
        """What ``source`` (a standard-input program, input ``ok``) printed, or why it printed nothing."""
        program = Program(prime_module_source(source, None), None, False, ["ok"])
        [report] = await self._run(program, [RunSpec([0], 20, 20.0)], isolation)
        self.confined = report.confined
        for record in report.records:
            for key in ("load_error", "error", "abort"):
                if key in record:
                    return clean_text(record[key], 300)
            if "out" in record:
                return str(record["out"])
        what = f"signal {report.signal}" if report.signal else f"exit code {report.exit}"
        return "timed out" if report.timed_out else f"it ended ({what}) without printing"

    def rlimits_warning(self) -> str:
        """What ``rlimits`` leaves open here (logged at every worker start)."""
        if os.geteuid() == 0:
            return (
                "code_local_isolation=rlimits: programs run without namespaces (own uid, cgroup and syscall "
                "filter, but they see the host's filesystem and network: they CAN open network connections and "
                "read world-readable files). Use the default (namespaces) or sandbox_fusion_url for untrusted code"
            )
        return (
            "code_local_isolation=rlimits: programs run as this worker's user without namespaces or cgroups: "
            "Landlock (where the kernel has it) limits what they read and blocks TCP and signals, but a "
            "hostile program can still use all the CPU and memory its limits allow and slow its neighbours' "
            "programs. Use the default (namespaces, as root) or sandbox_fusion_url for untrusted code"
        )

    # -- running ------------------------------------------------------------------------
    async def execute(self, program: Program, runs: list[RunSpec]) -> list[RunReport]:
        """Run ``program`` once per entry of ``runs``, each in a fresh process, in one sandbox.

        Raises:
            CodeSandboxError: the sandbox itself failed, or refuses (not the program).
        """
        if not runs:
            return []
        isolation = await self.start()
        async with self._slots:
            return await self._run(program, runs, isolation)

    def _job(
        self,
        program: Program,
        runs: list[RunSpec],
        isolation: str,
        workdir: str | None,
        uid: int | None = None,
        cgroup: JobCgroup | None = None,
    ) -> dict[str, object]:
        return {
            "isolation": isolation,
            "uid": uid,
            "workdir": workdir,
            "hide": list(self.hidden),
            "secrets": list(self.secrets),
            "read_paths": list(SYSTEM_READABLE),
            "cgroup": cgroup.harness_fields() if cgroup else None,
            "wall_factor": CODE_WALL_FACTOR,
            "limits": {
                "memory_mb": self.limits.memory_mb,
                "file_mb": self.limits.file_mb,
                "processes": self.limits.processes,
                "output_bytes": self.limits.output_bytes,
                "job_output_bytes": self.limits.job_output_bytes,
            },
            "module": program.module,
            "fn_name": program.fn_name,
            "solution_class": program.solution_class,
            "inputs": program.inputs,
            "tests": program.tests,
            "runs": [{"cases": r.cases, "timeout": r.timeout, "deadline": r.deadline} for r in runs],
            "preimport": list(PREIMPORT),
        }

    def _job_limits(self) -> JobLimits:
        memory = (self.limits.memory_mb + CODE_JOB_MEMORY_SLACK_MB) * 1024 * 1024
        return JobLimits(memory_bytes=memory, pids=self.limits.processes + 2)

    async def _run(self, program: Program, runs: list[RunSpec], isolation: str) -> list[RunReport]:
        root = os.geteuid() == 0
        lease: UidLease | None = self._uids.acquire() if root else None
        cgroup = self._cgroups.create(self._job_limits()) if root and self._cgroups is not None else None
        workdir = None
        try:
            if isolation == "rlimits":
                workdir = tempfile.mkdtemp(prefix="rewardq-code-")
                if lease is not None:
                    os.chown(workdir, lease.uid, lease.uid)
            job = self._job(program, runs, isolation, workdir, lease.uid if lease else None, cgroup)
            if isolation == "namespaces":
                assert self._unshare is not None
                cmd = [self._unshare, *UNSHARE_ARGS, "--", sys.executable, "-I", "-B", HARNESS]
                env = _scrubbed_env("/tmp/work")
            else:
                cmd = [sys.executable, "-I", "-B", HARNESS]
                env = _scrubbed_env(workdir or "/tmp")
            wall = sum(r.deadline for r in runs) * CODE_WALL_FACTOR + CODE_STARTUP_SLACK
            cap = self.limits.job_output_bytes + len(runs) * 65536 + 65536
            out, err, code = await _invoke(cmd, env, json.dumps(job).encode(), wall, cap)
            return parse_report(out, err, code, len(runs))
        finally:
            if cgroup is not None:
                await asyncio.shield(cgroup.destroy())
            if lease is not None:
                lease.release()  # after the cgroup is empty: no process of this uid is left
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
        raise CodeSandboxError(  # a host starved far past the job's own deadlines: may pass
            f"the local code sandbox did not finish within {wall:.0f}s", failure_kind=FailureKind.TRANSIENT
        ) from None
    finally:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await asyncio.shield(proc.wait())
    return out, err, code
