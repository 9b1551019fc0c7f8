"""A throwaway ``redis-server`` and ``rewardq worker`` processes, as this folder's benchmarks start them.

Both the comparison's rewardq side (:mod:`benchmarks.verl_loop.side`) and the producer benchmark
(:mod:`benchmarks.verl_loop.producer`) score on a Redis of their own, so its CPU is the broker's
and no other client's, with workers of the naive manager started from this interpreter's rewardq.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(tmp: Path, maxmemory: str) -> tuple[subprocess.Popen[bytes], str]:
    """A ``redis-server`` (no persistence, ``maxmemory`` with noeviction) in ``tmp``, answering
    PING, and its URL."""
    import redis

    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--maxmemory", maxmemory, "--maxmemory-policy", "noeviction", "--dir", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    r = redis.Redis.from_url(url)
    try:
        for _ in range(200):
            try:
                r.ping()
                return server, url
            except redis.ConnectionError:
                time.sleep(0.05)
    finally:
        r.close()
    server.terminate()
    raise RuntimeError(f"the benchmark's redis-server on port {port} did not start")


def start_workers(
    url: str,
    namespace: str,
    names: Sequence[str],
    tokenizer: str,
    logs: Path,
    extra: Sequence[str] = (),
    profile: Path | None = None,
) -> list[subprocess.Popen[bytes]]:
    """One ``rewardq worker`` (naive manager) per name, each logging to ``logs/<name>.log``; with
    ``profile``, each runs under cProfile (:mod:`benchmarks.verl_loop.profiled_worker`), dumped to
    ``<profile>.<name>`` when it stops."""
    workers = []
    for name in names:
        with open(logs / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            run = ["rewardq"] if profile is None else ["benchmarks.verl_loop.profiled_worker", f"{profile}.{name}"]
            argv = [sys.executable, "-m", *run, "worker", "--redis-url", url, "--namespace", namespace,
                    "--name", name, "--manager", "naive", "--tokenizer", tokenizer, "--log-level", "warning",
                    *extra]  # fmt: skip
            workers.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
    return workers


def workers_up(
    r: Any,
    namespace: str,
    names: Sequence[str],
    workers: Sequence[subprocess.Popen[bytes]],
    logs: Path,
    deadline: float,
) -> bool:
    """Whether every worker has registered; raises with the first one's log tail when one exited
    or ``deadline`` (``time.monotonic``) passed first."""
    if all(r.exists(f"{namespace}:worker:{n}") for n in names):
        return True
    if any(w.poll() is not None for w in workers) or time.monotonic() > deadline:
        tail = (logs / f"{names[0]}.log").read_bytes()[-1500:].decode("utf-8", "replace")
        raise RuntimeError(f"rewardq workers did not start: {tail}")
    return False
