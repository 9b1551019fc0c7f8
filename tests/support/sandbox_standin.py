"""A local stand-in for SandboxFusion's ``run_code`` endpoint, started by the tests.

Same endpoint and JSON shapes as SandboxFusion for Python: ``POST /run_code`` with
``{code, stdin, compile_timeout, run_timeout, memory_limit_MB, language, files, fetch_files}``
answers ``{status, message, compile_result, run_result: {status, execution_time, return_code,
stdout, stderr}, executor_pod_name, files}``. It really runs the program (``python -I -S`` in
a subprocess, with an address-space limit of ``memory_limit_MB``, the run timeout and an
output cap), and counts how many runs are in flight at once.

Test hooks: ``GET /stats`` (runs, in flight, the most ever in flight, the memory limits
received), ``GET /log`` (every request as ``{"t", "status"}``, in arrival order), ``POST /control``
(``{"fail_next": n, "status": 503}``: answer the next n requests with that HTTP status;
``{"down_for": s, "status": 503}``: every request for the next s seconds; ``{"delay": s}``: wait s
seconds before each run). ``--port P`` listens on P, so a test can stop the stand-in (the sandbox
is then unreachable: connection refused) and start it again where clients look for it.

Run it as ``python -m tests.support.sandbox_standin --port 0``; it prints ``PORT <n>`` when
it listens. :class:`Standin` starts and stops it from a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.standin_process import StandinProcess, serve

OUTPUT_CAP = 1 << 20


class State:
    def __init__(self) -> None:
        self.runs = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.memory_limits: set[int] = set()
        self.fail_next = 0
        self.fail_status = 503
        self.delay = 0.0
        self.down_until = 0.0
        self.log: list[dict[str, Any]] = []


async def _read_capped(stream: asyncio.StreamReader) -> tuple[bytes, bool]:
    data = bytearray()
    while chunk := await stream.read(65536):
        if len(data) < OUTPUT_CAP:
            data += chunk[: OUTPUT_CAP - len(data)]
        else:
            return bytes(data), True
    return bytes(data), False


async def execute(code: str, stdin: str | None, run_timeout: float, memory_mb: int) -> dict[str, Any]:
    """Run ``code`` with Python; SandboxFusion's ``run_result`` for it."""
    with tempfile.TemporaryDirectory(prefix="standin-") as tmp:
        path = Path(tmp) / "main.py"
        path.write_text(code)
        limit = memory_mb * 1024 * 1024

        def limits() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            str(path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tmp,
            preexec_fn=limits,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        if stdin:
            proc.stdin.write(stdin.encode())
        proc.stdin.close()
        timed_out = False
        try:
            (out, cut), (err, _) = await asyncio.wait_for(
                asyncio.gather(_read_capped(proc.stdout), _read_capped(proc.stderr)), run_timeout
            )
            if cut:
                os.killpg(proc.pid, signal.SIGKILL)
            code_ = await proc.wait()
        except asyncio.TimeoutError:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            out, err, code_ = b"", b"", None
    return {
        "status": "TimeLimitExceeded" if timed_out else "Finished",
        "execution_time": time.monotonic() - started,
        "return_code": code_,
        "stdout": out.decode(errors="replace"),
        "stderr": err.decode(errors="replace"),
    }


async def run_code(request: web.Request) -> web.Response:
    state: State = request.app["state"]
    entry: dict[str, Any] = {"t": time.time(), "status": 200}
    state.log.append(entry)
    if state.fail_next > 0 or entry["t"] < state.down_until:
        state.fail_next = max(0, state.fail_next - 1)
        entry["status"] = state.fail_status
        return web.Response(status=state.fail_status, text="injected failure")
    body = await request.json()
    state.runs += 1
    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    try:
        state.memory_limits.add(int(body["memory_limit_MB"]))
        if state.delay:
            await asyncio.sleep(state.delay)
        answer: dict[str, Any]
        if body.get("language") != "python":
            answer = {"status": "SandboxError", "message": f"unsupported language {body.get('language')!r}"}
        else:
            ran = await execute(
                body["code"], body.get("stdin"), float(body["run_timeout"]), int(body["memory_limit_MB"])
            )
            ok = ran["status"] == "Finished" and ran["return_code"] == 0
            answer = {"status": "Success" if ok else "Failed", "message": "", "compile_result": None, "run_result": ran}
    finally:
        state.in_flight -= 1
    answer.update(executor_pod_name="standin", files={})
    return web.json_response(answer)


async def stats(request: web.Request) -> web.Response:
    s: State = request.app["state"]
    return web.json_response(
        {
            "runs": s.runs,
            "in_flight": s.in_flight,
            "max_in_flight": s.max_in_flight,
            "memory_limits": sorted(s.memory_limits),
        }
    )


async def log(request: web.Request) -> web.Response:
    return web.json_response(request.app["state"].log)


async def control(request: web.Request) -> web.Response:
    s: State = request.app["state"]
    body = await request.json()
    if "down_for" in body:
        s.down_until = time.time() + float(body["down_for"])
    s.fail_next = int(body.get("fail_next", s.fail_next))
    s.fail_status = int(body.get("status", s.fail_status))
    s.delay = float(body.get("delay", s.delay))
    return web.json_response({"ok": True})


def make_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app["state"] = State()
    app.router.add_post("/run_code", run_code)
    app.router.add_get("/stats", stats)
    app.router.add_get("/log", log)
    app.router.add_post("/control", control)
    return app


class Standin(StandinProcess):
    """The stand-in as a child process of the test: ``url``, :meth:`stats`, :meth:`control`, :meth:`stop`."""

    def __init__(self, tmp: Path, port: int = 0) -> None:
        super().__init__("tests.support.sandbox_standin", tmp / "standin.log", port=port)
        self.base = self.root
        self.url = self.base + "/run_code"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve(make_app(), parser.parse_args().port))
