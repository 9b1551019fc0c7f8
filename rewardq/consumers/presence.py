"""What a worker says about itself: the snapshot its heartbeat writes to ``<ns>:worker:<name>``.

``rewardq status`` and ``rewardq health`` read it. :class:`Presence` keeps what the snapshot
needs beyond the worker's counters: when the worker started, and the latencies of the
trajectories scored in the last minute (for the rate and the median latency).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

#: The worker's counters, in the order its heartbeat publishes them.
COUNTERS = ("read", "stored", "parked", "scored", "errors", "dead_letters", "reclaimed", "duplicates", "expired")


class Presence:
    """The worker's heartbeat snapshot.

    Args:
        manager_name: the manager the worker runs.
        stats: the worker's counters, published as they are.
        in_flight: the worker's held trajectories by id.
    """

    def __init__(self, *, manager_name: str, stats: Mapping[str, int], in_flight: Mapping[str, Any]) -> None:
        self.manager_name = manager_name
        self.stats = stats
        self.in_flight = in_flight
        self.started_at = time.time()
        self._recent: deque[tuple[float, float]] = deque(maxlen=512)  # (time, latency_ms)

    def scored(self, latency_ms: float) -> None:
        """Count a trajectory scored now, ``latency_ms`` after its producer sent it."""
        self._recent.append((time.time(), latency_ms))

    def snapshot(self, code: Any = None) -> dict[str, Any]:
        """Counters, in-flight work, rate (last 10 s) and median latency (last 60 s);
        ``code``: the manager's code-execution counters, if any."""
        now = time.time()
        recent = [lat for t, lat in self._recent if now - t <= 60]
        window = [t for t, _ in self._recent if now - t <= 10]
        return {
            **({"code": json.dumps(code.snapshot())} if code is not None and code.sources else {}),
            **self.stats,
            "in_flight": len(self.in_flight),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "manager": self.manager_name,
            "started_at": f"{self.started_at:.3f}",
            "rate": round(len(window) / 10.0, 3),
            "latency_p50_ms": round(sorted(recent)[len(recent) // 2], 3) if recent else "",
            "in_flight_tids": ",".join(list(self.in_flight)[:20]),
        }
