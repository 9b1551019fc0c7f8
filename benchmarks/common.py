"""What every benchmark phase shares: settings, result rows, child processes, key clean-up, timing.

Nothing here knows a queue system. Children are started in their own session and
stopped by their PID (SIGTERM, then SIGKILL of that session after a grace period); keys
are deleted by the exact prefixes this run created (``SCAN MATCH`` + ``UNLINK``), never
by flushing a database.
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeGuard, cast

import redis

from benchmarks.procfs import cpu_seconds, process_tree, status_kb
from rewardq.queue.clients import Key, StreamEntry, SyncPipeline, SyncRedis

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Settings:
    """The sizes and limits of one benchmark run (``--quick`` shrinks every one)."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    run_id: str = "x"
    seed: int = 0
    trajectories: int = 4000  # throughput backlog per system
    drain_timeout: float = 120.0  # seconds one drain may take before it is cut short
    latency_samples: int = 1000  # p99 of 300 samples is the 3rd-worst one: too few to compare systems
    latency_rate: float = 20.0  # trajectories per second during the latency phase
    latency_warmup: int = 20
    latency_timeout: float = 60.0
    #: ``final``: outputs 0..n-2 are put first (untimed, as an agent loop emits them turn by
    #: turn) and the clock runs from the final output's put (the issue's definition);
    #: ``whole``: all outputs in one put, timed. Peers take one job per trajectory, whose
    #: enqueue *is* their final put: they are timed the same way in both modes.
    latency_mode: str = "final"
    scorer: str = "gsm8k"  # or "trivial" (benchmarks.workload.SCORERS)
    two_workers: bool = True  # rewardq's throughput with two worker processes too
    latency_gap: float = 0.01  # seconds between the untimed prefix and the final put ("final" mode)
    backlogs: tuple[int, ...] = (1000, 100_000)  # memory phase backlog sizes, in trajectories
    memory_process: int = 1000  # trajectories each memory-phase worker scores before RSS is read
    memory_timeout: float = 120.0
    start_timeout: float = 60.0  # a worker process must be ready within this
    systems: tuple[str, ...] = ()
    phases: tuple[str, ...] = ("throughput", "latency", "memory")
    workdir: Path = Path("/tmp")
    profiler: str | None = None  # py-spy | pyinstrument | None
    quick: bool = False
    peer_paths: dict[str, str] = field(default_factory=dict)  # peer -> extra PYTHONPATH entry (child run)

    def prefix(self, system: str) -> str:
        """The key prefix / namespace of one system in this run."""
        return f"rqbench-{self.run_id}-{system}"


@dataclass
class Row:
    """One line of the result table. Unmeasured numbers stay None (printed as a dash)."""

    system: str
    phase: str
    workers: int = 1
    trajectories: int | None = None
    outputs: int | None = None
    seconds: float | None = None
    outputs_per_s: float | None = None
    traj_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    rss_mb: float | None = None
    cpu_ms: float | None = None  # worker process CPU (user+sys) per trajectory during the drain
    redis_cpu_ms: float | None = None  # Redis server CPU per trajectory during the drain
    backlog: int | None = None
    check: str = ""  # "ok" when sampled rewards matched the expected GSM8K scores
    status: str = "ok"  # ok | partial | not installed | error: ...
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def finite(x: float | None) -> TypeGuard[float]:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def percentiles(samples_s: list[float]) -> tuple[float, float, float]:
    """``(p50, p99, max)`` in milliseconds of latencies given in seconds."""
    import numpy as np

    a = np.asarray(samples_s, dtype=float) * 1000.0
    return float(np.percentile(a, 50)), float(np.percentile(a, 99)), float(a.max())


# ------------------------------------------------------------------------------------------
# Redis keys
# ------------------------------------------------------------------------------------------


class BenchPipeline(SyncPipeline, Protocol):
    """A blocking pipeline with the commands the raw loop sends as well."""

    def xack(self, name: Key, groupname: Key, *ids: Key) -> BenchPipeline: ...


class BenchRedis(SyncRedis, Protocol):
    """The blocking client of the benchmarks: rewardq's commands (with their replies, see
    :mod:`rewardq.queue.clients`) and the few more the baselines and peers send."""

    def pipeline(self, transaction: bool = True) -> BenchPipeline: ...
    def unlink(self, *names: Key) -> int: ...
    def get(self, name: Key) -> bytes | None: ...
    def info(self, section: str | None = None) -> dict[str, Any]: ...  # INFO's fields: numbers and text
    def xgroup_create(self, name: Key, groupname: Key, id: Key = "$", mkstream: bool = False) -> bool: ...
    def xreadgroup(
        self,
        groupname: Key,
        consumername: Key,
        streams: Mapping[Key, Key],
        count: int | None = None,
        block: int | None = None,
    ) -> list[tuple[bytes, list[StreamEntry]]]: ...


def connect(url: str) -> BenchRedis:
    """A blocking client for ``url``; redis-py types its replies ``Awaitable[T] | T``, BenchRedis states them."""
    return cast(BenchRedis, redis.Redis.from_url(url, socket_connect_timeout=5))


def delete_matching(r: BenchRedis, pattern: str) -> int:
    """UNLINK every key matching ``pattern`` (SCAN, never KEYS/FLUSH); returns the count."""
    n, batch = 0, []
    for k in r.scan_iter(match=pattern, count=2000):
        batch.append(k)
        if len(batch) >= 1000:
            n += r.unlink(*batch)
            batch = []
    if batch:
        n += r.unlink(*batch)
    return n


class Cleanup:
    """Remembers the key patterns this run created and deletes them at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.patterns: list[str] = []

    def add(self, *patterns: str) -> None:
        for p in patterns:
            if p not in self.patterns:
                self.patterns.append(p)

    def run(self, patterns: list[str] | None = None) -> int:
        r = connect(self.url)
        try:
            return sum(delete_matching(r, p) for p in (patterns or self.patterns))
        finally:
            r.close()


# ------------------------------------------------------------------------------------------
# child processes
# ------------------------------------------------------------------------------------------

_CHILDREN: list[Child] = []


class Child:
    """A worker process this run started.

    Args:
        cmd: argv.
        log: file receiving the child's stderr (and stdout unless ``handshake``).
        env: extra environment variables.
        handshake: the child prints ``READY`` on stdout once set up, then waits for a
            line on stdin before it starts consuming (our own runners do this).
    """

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str] | None = None, handshake: bool = False) -> None:
        self.cmd = cmd
        self.log = log
        self.handshake = handshake
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p)
        self._logf = open(log, "ab")
        self.proc = subprocess.Popen(
            cmd,
            cwd=str(REPO),
            env=full_env,
            start_new_session=True,
            stdin=subprocess.PIPE if handshake else subprocess.DEVNULL,
            stdout=subprocess.PIPE if handshake else self._logf,
            stderr=self._logf,
        )
        _CHILDREN.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float) -> None:
        """Wait for the ``READY`` line; raises RuntimeError (with the log tail) otherwise."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                buf += chunk
                if b"READY" in buf:
                    return
        raise RuntimeError(f"{self.cmd[:4]} not ready after {timeout:g}s (exit={self.proc.poll()}): {self.log_tail()}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"GO\n")
        self.proc.stdin.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.log.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def tree(self) -> list[int]:
        """This process and its descendants."""
        return process_tree(self.pid)

    def peak_rss_mb(self) -> float | None:
        """The largest ``VmHWM`` (peak resident set) among this process and its children."""
        peaks = [v for v in (status_kb(p, "VmHWM") for p in self.tree()) if v is not None]
        return max(peaks) / 1024.0 if peaks else None

    def cpu_seconds(self) -> float:
        """User + system CPU of this process and its children so far (all threads)."""
        return sum(cpu_seconds(p) for p in self.tree())

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM, wait ``grace``, then SIGKILL this child's session. Returns the exit code."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # the session we created for it
                except ProcessLookupError:
                    pass
                self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self._logf.close()
        if self in _CHILDREN:
            _CHILDREN.remove(self)
        return self.proc.returncode


def stop_all_children() -> None:
    """Stop every child still running (called on exit, also after errors and Ctrl-C)."""
    for child in list(_CHILDREN):
        child.stop(grace=10.0)


def redis_cpu_seconds(r: BenchRedis) -> float:
    """The Redis server's own CPU (``INFO cpu``: used_cpu_user + used_cpu_sys)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# ------------------------------------------------------------------------------------------
# waiting for a drain
# ------------------------------------------------------------------------------------------


@dataclass
class Drain:
    """How a drain went: counts and times of the first and last progress seen."""

    target: int
    first_count: int = 0
    first_t: float | None = None
    last_count: int = 0
    last_t: float | None = None
    started_t: float = 0.0
    complete: bool = False
    first_snap: dict[str, float] = field(default_factory=dict)
    last_snap: dict[str, float] = field(default_factory=dict)

    def per_completion_ms(self, name: str) -> float | None:
        """Milliseconds of the snapshotted quantity ``name`` (a CPU clock) per completion."""
        n = self.last_count - self.first_count
        if n <= 0 or name not in self.first_snap or name not in self.last_snap:
            return None
        return 1000.0 * (self.last_snap[name] - self.first_snap[name]) / n

    def row_fields(self, nt: int, no: int) -> dict[str, Any]:
        """The :class:`Row` fields this drain of ``nt`` trajectories holding ``no`` outputs measured:
        completions, time, rates, CPU per completion (worker and Redis, where snapshotted), status."""
        rate = self.rate
        return dict(
            trajectories=self.last_count,
            seconds=self.seconds,
            traj_per_s=rate,
            outputs_per_s=(rate * no / nt) if rate else None,
            cpu_ms=self.per_completion_ms("cpu"),
            redis_cpu_ms=self.per_completion_ms("redis"),
            status="ok" if self.complete else "partial",
        )

    @property
    def rate(self) -> float | None:
        """Completions per second between the first and the last completion seen."""
        if self.first_t is None or self.last_t is None or self.last_t <= self.first_t:
            return None
        return (self.last_count - self.first_count) / (self.last_t - self.first_t)

    @property
    def seconds(self) -> float | None:
        if self.first_t is None or self.last_t is None:
            return None
        return self.last_t - self.first_t


def watch_drain(
    count: Callable[[], int],
    target: int,
    timeout: float,
    poll: float = 0.005,
    alive: Callable[[], bool] | None = None,
    snaps: dict[str, Callable[[], float]] | None = None,
) -> Drain:
    """Poll ``count()`` until it reaches ``target`` or ``timeout`` passes.

    Throughput is measured from the first poll that saw a completion to the first poll
    that saw the target, the same way for every system: start-up costs (imports, the
    first read) are excluded, and one poll period (5 ms) is the resolution. ``snaps``
    (CPU clocks) are read at the same two moments, for cost per completion.
    """
    snaps = snaps or {}
    d = Drain(target=target, started_t=time.perf_counter())
    deadline = d.started_t + timeout
    while True:
        now = time.perf_counter()
        c = count()
        if c > 0 and d.first_t is None:
            d.first_t, d.first_count = now, c
            d.first_snap = {k: f() for k, f in snaps.items()}
        if c != d.last_count or d.last_t is None:
            d.last_count, d.last_t = c, now
            if d.first_t is not None and (c >= target or now >= deadline):
                d.last_snap = {k: f() for k, f in snaps.items()}
        if c >= target:
            d.complete = True
            return d
        if now >= deadline or (alive is not None and not alive()):
            if d.first_t is not None and not d.last_snap:
                d.last_snap = {k: f() for k, f in snaps.items()}
            return d
        time.sleep(poll)


def paced(n: int, rate: float, fn: Callable[[int], float | None], timeout: float) -> list[float]:
    """Call ``fn(i)`` for ``i < n`` at ``rate`` per second; returns each call's duration (s).

    A call that times only part of its own work (the final ``put`` after an untimed
    prefix) returns that duration, which is used instead of the whole call's. Calls start
    on a fixed schedule (open loop); a slow call delays only the next start. Stops early
    when ``timeout`` seconds have passed.
    """
    out: list[float] = []
    t0 = time.perf_counter()
    for i in range(n):
        due = t0 + i / rate
        now = time.perf_counter()
        if now - t0 > timeout:
            break
        if due > now:
            time.sleep(due - now)
        s = time.perf_counter()
        part = fn(i)
        out.append(time.perf_counter() - s if part is None else part)
    return out


def installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
