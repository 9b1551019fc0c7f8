"""A stand-in HTTP server run as a child process of a test, and how a test talks to it.

Each stand-in module (``tests.support.sandbox_standin``, ``tests.support.judge_standin``) has an
aiohttp app, :func:`serve` it on loopback (it prints ``PORT <n>`` once it listens), and a small
subclass of :class:`StandinProcess` that starts ``python -m <module>``, reads the port, and calls
its test hooks (``GET /stats``, ``POST /control``) with :meth:`StandinProcess.call`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.cli_procs import REPO


async def serve(app: web.Application, port: int, **runner_options: Any) -> None:
    """Serve ``app`` on 127.0.0.1:``port`` (0: any free port), print ``PORT <n>``, run for ever."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp keeps the server private
    print(f"PORT {bound}", flush=True)
    await asyncio.Event().wait()


class StandinProcess:
    """``python -m <module> --port PORT *args`` as a child process (PORT 0: any free port); ``root``
    is its http://127.0.0.1:<port>."""

    def __init__(self, module: str, log: Path, *args: str, port: int = 0) -> None:
        self.log = log
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, "--port", str(port), *args],
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                cwd=str(REPO),
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"{module} did not start: {line!r} {self.log.read_text()[-2000:]}")
        self.root = f"http://127.0.0.1:{int(line.split()[1])}"

    def call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """GET ``path`` (or POST ``body`` as JSON to it); the decoded JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.root + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def requests(self) -> list[dict[str, Any]]:
        """The stand-in's own log of the requests it answered (``GET /log``), in arrival order."""
        entries: list[dict[str, Any]] = self.call("/log")
        return entries

    def stats(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.call("/stats")
        return answer

    def control(self, **body: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self.call("/control", body)
        return answer

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
