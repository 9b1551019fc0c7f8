"""Run ``python -m rewardq ...`` as real processes in tests, and always stop them by PID.

Output goes to a file per process (never a pipe: a worker logging one line per trajectory
would fill a pipe buffer and block). :class:`Procs` remembers every process it started and
the fixture in each test module kills the leftovers, so a failing assertion never leaves a
worker running against the shared Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class Proc:
    """A started ``rewardq`` process and its combined stdout/stderr file."""

    def __init__(self, popen: subprocess.Popen[bytes], log: Path, out: Path) -> None:
        self.popen, self.log, self.out = popen, log, out

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait for the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=timeout)


class Procs:
    """Starts ``python -m rewardq <args>`` processes; :meth:`kill_all` stops leftovers by PID."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[Proc] = []

    def start(
        self,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        tag: str = "proc",
        prefix: Sequence[str] = (),
        python: str = sys.executable,
    ) -> Proc:
        """``python -m rewardq <args>`` (this interpreter unless ``python`` says another), after
        ``prefix`` (a command that runs the rest: an ``unshare``)."""
        n = len(self.started)
        log, out = self.tmp / f"{tag}-{n}.err", self.tmp / f"{tag}-{n}.out"
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
        with open(log, "wb") as e, open(out, "wb") as o:
            popen = subprocess.Popen(
                [*prefix, python, "-m", "rewardq", *args],
                stdout=o,
                stderr=e,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=str(self.tmp),
            )
        p = Proc(popen, log, out)
        self.started.append(p)
        return p

    def run(
        self, args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 60.0, tag: str = "run"
    ) -> tuple[int, Proc]:
        p = self.start(args, env=env, tag=tag)
        return p.wait(timeout), p

    def kill_all(self) -> None:
        for p in self.started:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait(timeout=10)


def worker_argv(
    redis_url: str,
    ns: str,
    name: str,
    *extra: str,
    manager: str | None = None,
    tokenizer: str | None = "builtin:demo",
) -> list[str]:
    """``worker --redis-url URL --namespace NS [--manager M] [--tokenizer T] --name NAME *extra``:
    the arguments of a ``rewardq worker`` on a test's namespace (no ``--manager``: the default one)."""
    chosen = [*(["--manager", manager] if manager else []), *(["--tokenizer", tokenizer] if tokenizer else [])]
    return ["worker", "--redis-url", redis_url, "--namespace", ns, *chosen, "--name", name, *extra]


#: Seconds a test waits for CLI workers to start (their heartbeats): a start pays the torch import,
#: which took over 90 s on a loaded 2-core machine with other workers starting; the wait ends as
#: soon as they are up, so only a worker that never starts pays it. Below the tests' 300 s timeout
#: (pyproject.toml), so a worker that never starts is reported with its log.
START_WAIT = 200.0


def wait_for(
    predicate: Callable[[], object], timeout: float, what: str, poll: float = 0.05, procs: Sequence[Proc] = ()
) -> object:
    """Poll ``predicate`` until truthy; fail with ``what`` (and any dead process's log) on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for p in procs:
            if p.popen.poll() is not None:
                raise AssertionError(
                    f"process {p.pid} exited with {p.popen.returncode} while waiting for {what}; "
                    f"its log:\n{p.stderr()[-3000:]}"
                )
        if time.monotonic() > deadline:
            logs = "\n".join(p.stderr()[-2000:] for p in procs)
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")
        time.sleep(poll)
