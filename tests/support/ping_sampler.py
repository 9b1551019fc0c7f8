"""PING a Redis every 10 ms from a process of its own and report the slowest answers.

    python -m tests.support.ping_sampler redis://127.0.0.1:PORT/0

Runs until its standard input closes, then prints one JSON object: ``samples``, ``worst_ms``,
``over_100ms`` (how many took longer) and the five slowest ``(unix time, ms)``. Its own process
keeps the test's Python work (and its GIL) out of the measurement.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import redis


def main(url: str) -> None:
    r = redis.Redis.from_url(url, socket_timeout=30)
    done = threading.Event()

    def wait_for_stdin() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_stdin, daemon=True).start()
    times: list[tuple[float, float]] = []
    while not done.is_set():
        t0 = time.perf_counter()
        r.ping()
        times.append((time.time(), (time.perf_counter() - t0) * 1000))
        time.sleep(0.01)
    slow = sorted(times, key=lambda t: -t[1])
    print(
        json.dumps(
            {
                "samples": len(times),
                "worst_ms": slow[0][1] if slow else None,
                "over_100ms": sum(1 for _, ms in times if ms > 100),
                "slowest": [(round(t, 3), round(ms, 2)) for t, ms in slow[:5]],
            }
        )
    )


class PingSampler:
    """``with PingSampler(url) as s: ...`` then ``s.result`` (the JSON above, as a dict)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.result: dict[str, Any] = {}
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> PingSampler:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.ping_sampler", self.url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.3)  # connected and sampling
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.proc is not None
        out, _ = self.proc.communicate("", timeout=30)
        self.result = json.loads(out) if out.strip() else {}


if __name__ == "__main__":
    main(sys.argv[1])
