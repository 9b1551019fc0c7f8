"""Run the operator commands (``rewardq status``, ``inspect``, ``dead-letters``, ``health``) in tests.

:func:`rq` runs one in-process through ``rewardq.cli._run`` (the console script's path: exit codes
and one-line errors included) with stdout/stderr captured; :func:`on_a_terminal` runs one as a real
process whose terminal is a pty, where a terminal or a signal matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from click.testing import CliRunner

from rewardq import cli as cli_module
from tests.support.cli_procs import REPO


def rq(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> tuple[int, str, str]:
    """Run ``rewardq ARGS`` in-process; returns (exit code, stdout, stderr)."""
    runner = CliRunner()
    with runner.isolation(input=input, env={"COLUMNS": "220", **(env or {})}) as (out, err, _):
        try:
            code = cli_module._run(list(args))
        finally:
            sys.stdout.flush()  # what the console script does at exit (a traceback is plain buffered text)
            sys.stderr.flush()
            cli_module._state["debug"] = False  # --debug is process-wide; these runs share one process
    return code, out.getvalue().decode(), err.getvalue().decode()


async def arq(*args: str, **kw: Any) -> tuple[int, str, str]:
    """:func:`rq` from a coroutine, so in-process workers keep running meanwhile."""
    return await asyncio.to_thread(rq, *args, **kw)


def check_types(d: dict[str, Any], spec: dict[str, Any]) -> None:
    """Assert ``d`` has every key of ``spec`` with a value of the given type(s)."""
    for key, types in spec.items():
        assert key in d, f"missing {key!r} in {sorted(d)}"
        assert isinstance(d[key], types), f"{key}: {d[key]!r} is not {types}"


@contextlib.contextmanager
def on_a_terminal(
    args: Sequence[str], env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``python -m rewardq ARGS`` with a pty for stdin, stdout and stderr; yields the process and the
    pty's master end (read it with :func:`read_until`). Kills the process if still running on exit."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rewardq", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    os.close(slave)
    try:
        yield proc, master
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def read_until(fd: int, needle: str, timeout: float, send: bytes | None = None) -> str:
    """Read a pty until ``needle`` appears (then write ``send``); returns what was read."""
    text, deadline = "", time.monotonic() + timeout
    while needle not in text:
        assert time.monotonic() < deadline, f"{needle!r} never appeared in:\n{text}"
        if select.select([fd], [], [], 0.2)[0]:
            try:
                text += os.read(fd, 65536).decode(errors="replace")
            except OSError:
                break
    if send is not None:
        os.write(fd, send)
    return text


def wait_reading(proc: subprocess.Popen[bytes], fd: int, timeout: float) -> int:
    """``proc``'s exit code, reading (and dropping) what it writes to the pty meanwhile: a full-screen
    program blocks in a write once the pty's buffer is full, and one stopped by a signal still writes
    its screen back on the way out."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"still running after {timeout} s"
        if select.select([fd], [], [], 0.1)[0]:
            try:
                os.read(fd, 65536)
            except OSError:
                break
    return proc.wait(timeout=max(0.1, deadline - time.monotonic()))
