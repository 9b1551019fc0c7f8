"""PING a Redis every 10 ms from a process of its own and report how its answers were spread.

    python -m tests.support.ping_sampler redis://127.0.0.1:PORT/0 [redis://127.0.0.1:OTHER/0]

Prints ``sampling`` once its first PINGs were answered (:class:`PingSampler` waits for that line, so
a loaded machine's slow interpreter start-up is never a window without samples), runs until its
standard input closes, then prints one JSON object about the first server:
``samples``, ``wall_ms`` (how long it sampled), ``worst_ms``, ``p99_ms`` (the sample 1 % of
them are slower than), ``over_100ms`` (how many took longer), ``slow_share`` (that count over
``samples``), ``excess_ms`` (the time spent beyond 100 ms in slow answers: a one-second freeze
counts a second, however few samples it stopped), ``excess_share`` (that over ``wall_ms``) and the
five slowest ``(unix time, ms)``. With a second URL (a **control**: an idle server on the same
machine) it PINGs both in turn and adds the same figures for the control under ``control``, so a
test can tell what its own load did to Redis from what a busy machine did to every process at that
time.
Its own process keeps the test's Python work (and its GIL) out of the measurement.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import redis

SLOW_MS = 100.0


def summary(times: list[tuple[float, float]], wall_ms: float) -> dict[str, Any]:
    """The figures of the module docstring for ``(unix time, ms)`` samples over ``wall_ms``."""
    slow = sorted(times, key=lambda t: -t[1])
    over = [ms for _, ms in times if ms > SLOW_MS]
    return {
        "samples": len(times),
        "wall_ms": wall_ms,
        "worst_ms": slow[0][1] if slow else None,
        "p99_ms": slow[len(slow) // 100][1] if slow else None,
        "over_100ms": len(over),
        "slow_share": len(over) / len(times) if times else 0.0,
        "excess_ms": sum(ms - SLOW_MS for ms in over),
        "excess_share": sum(ms - SLOW_MS for ms in over) / wall_ms if wall_ms > 0 else 0.0,
        "slowest": [(round(t, 3), round(ms, 2)) for t, ms in slow[:5]],
    }


def main(url: str, control_url: str | None = None) -> None:
    targets = [redis.Redis.from_url(u, socket_timeout=30) for u in (url, control_url) if u]
    done = threading.Event()

    def wait_for_stdin() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_stdin, daemon=True).start()
    times: list[list[tuple[float, float]]] = [[] for _ in targets]
    for r in targets:
        r.ping()  # connected
    print("sampling", flush=True)
    start = time.perf_counter()
    while not done.is_set():
        for r, got in zip(targets, times):
            t0 = time.perf_counter()
            r.ping()
            got.append((time.time(), (time.perf_counter() - t0) * 1000))
        time.sleep(0.01)
    wall_ms = (time.perf_counter() - start) * 1000
    out = summary(times[0], wall_ms)
    if control_url:
        out["control"] = summary(times[1], wall_ms)
    print(json.dumps(out))


class PingSampler:
    """``with PingSampler(url[, control=url2]) as s: ...`` then ``s.result`` (the JSON above, as a dict)."""

    def __init__(self, url: str, control: str | None = None) -> None:
        self.url = url
        self.control = control
        self.result: dict[str, Any] = {}
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> PingSampler:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.ping_sampler", self.url, *([self.control] if self.control else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "sampling"  # connected and sampling
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.proc is not None
        out, _ = self.proc.communicate("", timeout=30)
        lines = [line for line in out.splitlines() if line.strip()]
        self.result = json.loads(lines[-1]) if lines else {}


if __name__ == "__main__":
    main(*sys.argv[1:3])
