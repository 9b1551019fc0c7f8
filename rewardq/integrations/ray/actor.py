"""The body of one fleet actor: :class:`FleetWorker` runs and watches one ``rewardq worker`` process.

:mod:`rewardq.integrations.ray.fleet` makes it a Ray actor and drives the fleet; this module holds the
process handling (start under the guardian, watch, stop gracefully, sweep what is left).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import ray

from rewardq.config import WorkerConfig
from rewardq.errors import RewardqError

__all__ = ["FleetError", "FleetWorker"]

logger = logging.getLogger("rewardq.fleet")

#: Seconds a stopping worker gets on top of its ``shutdown_grace`` before its process group is killed.
STOP_SLACK = 10.0
#: A worker process that dies sooner than this after its start waits this long before its actor
#: exits (and Ray restarts it), so a worker that cannot start does not restart in a tight loop.
CRASH_BACKOFF = 5.0
#: Lines of a worker's log kept for the error message when it fails to start.
LOG_TAIL_LINES = 15


class FleetError(RewardqError):
    """A fleet could not start (a worker exited with a configuration error, or none became ready)."""


class FleetWorker:
    """The body of one fleet actor: runs and watches one ``rewardq worker`` process.

    The worker runs under a guardian (:mod:`rewardq.integrations.ray.guardian`) that is no
    descendant of the actor, so Ray's abrupt end of an actor's processes cannot reach it: the
    guardian stops it gracefully when the actor is gone.

    Args:
        spec: ``index``, ``prefix`` (worker names are ``<prefix>-<index>-<4 hex>``), ``config``
            (the JSON the worker reads with ``--config``), ``flags`` (more ``rewardq worker``
            arguments), ``env`` (variables for the process) and ``grace`` (seconds a stop waits
            before killing).
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.index = int(spec["index"])
        self.name = f"{spec['prefix']}-{self.index}-{secrets.token_hex(2)}"
        ctx = ray.get_runtime_context()
        self.reconstructed = bool(ctx.was_current_actor_reconstructed)
        self.node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # ray leaves it unannotated
        base = Path(ctx.get_temp_dir() if hasattr(ctx, "get_temp_dir") else tempfile.gettempdir()) / "rewardq"
        base.mkdir(parents=True, exist_ok=True)
        self.state_path = base / self.name  # the guardian writes <name>.pid and <name>.rc
        self.log_path = base / f"{self.name}.log"
        self.config_path = base / f"{self.name}.json"
        self.config_path.write_text(json.dumps(spec["config"]))
        self.state = "starting"
        self.exit_code: int | None = None
        self.started_at = time.time()
        self._stopping = threading.Event()
        self._pids: tuple[int, int] | None = None  # (worker, guardian)
        spawned = threading.Event()
        self._watcher = threading.Thread(target=self._watch, args=(spawned,), name="rewardq-worker", daemon=True)
        self._watcher.start()
        spawned.wait(60)

    def _argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "rewardq.integrations.ray.guardian",
            str(os.getpid()),
            str(self.state_path),
            "worker",
            "--config",
            str(self.config_path),
            *self.spec.get("flags", []),
            "--name",
            self.name,
        ]

    def _file(self, suffix: str) -> str | None:
        try:
            return self.state_path.with_name(self.name + suffix).read_text()
        except OSError:
            return None

    def _watch(self, spawned: threading.Event) -> None:
        """Start the guardian, then follow the worker until it exits; act on how it exited."""
        env = {**os.environ, **self.spec.get("env", {})}
        try:
            with open(self.log_path, "ab") as log:
                subprocess.run(self._argv(), env=env, stdout=log, stderr=subprocess.STDOUT, check=False, timeout=60)
            deadline = time.monotonic() + 60
            while self._file(".pid") is None and time.monotonic() < deadline:
                time.sleep(0.05)
            pids = (self._file(".pid") or "").split()
            if len(pids) != 2:
                raise OSError(f"the guardian did not start the worker (see {self.log_path})")
            self._pids = (int(pids[0]), int(pids[1]))
        except (OSError, subprocess.SubprocessError) as exc:
            with open(self.log_path, "ab") as log:
                log.write(f"could not start the worker process: {exc}\n".encode())
            self.state, self.exit_code = "failed", 2
            spawned.set()
            return
        self.state = "running"
        spawned.set()
        rc = self._wait_exit()
        self.exit_code = rc
        self._sweep()
        if self._stopping.is_set():
            self.state = "stopped"
            return
        if rc == 2:  # a configuration error: a restart cannot fix it; stay up and say so
            self.state = "failed"
            return
        self.state = "died"
        ran = time.time() - self.started_at
        print(f"rewardq worker {self.name} (pid {self.worker_pid()}) died with code {rc} after {ran:.1f}s; restarting")
        if ran < CRASH_BACKOFF * 2:
            time.sleep(CRASH_BACKOFF)
        sys.stdout.flush()
        os._exit(1)  # the actor dies with its worker: Ray restarts the actor, which starts a new one

    def _wait_exit(self, timeout: float | None = None) -> int | None:
        """The worker's exit code once it has exited (``-1`` when its guardian died without saying),
        or None after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        assert self._pids is not None
        while True:
            rc = self._file(".rc")
            if rc is not None:
                return int(rc)
            if not _alive(self._pids[1]) and not _alive(self._pids[0]) and self._file(".rc") is None:
                return -1
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    def worker_pid(self) -> int | None:
        """The worker process's pid, once its guardian has started it."""
        return self._pids[0] if self._pids else None

    def _sweep(self) -> None:
        """Kill what the worker process left in its process group (scorer processes, sandboxes)."""
        pid = self.worker_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def info(self) -> dict[str, Any]:
        """Who and where this worker is, and how its process is doing."""
        out = {
            "index": self.index,
            "name": self.name,
            "state": self.state,
            "pid": self.worker_pid(),
            "guardian_pid": self._pids[1] if self._pids else None,
            "actor_pid": os.getpid(),
            "host": socket.gethostname(),
            "node_ip": self.node_ip,
            "started_at": self.started_at,
            "reconstructed": self.reconstructed,
            "exit_code": self.exit_code,
            "log": str(self.log_path),
        }
        if self.state == "failed":
            out["log_tail"] = self.log_tail()
        return out

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM the worker process, wait up to ``grace`` seconds, then kill its process group."""
        self._stopping.set()
        pid = self.worker_pid()
        if pid is None or self._pids is None:
            return None
        grace = float(self.spec.get("grace", WorkerConfig.shutdown_grace + STOP_SLACK)) if grace is None else grace
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        rc = self._wait_exit(grace)
        if rc is None:
            logger.warning("worker %s did not stop within %.0fs; killing it", self.name, grace)
            self._sweep()
            rc = self._wait_exit(5)
        self._sweep()
        self._watcher.join(5)
        self.state = "stopped"
        return rc


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
