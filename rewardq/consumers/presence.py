"""What a worker says about itself: the snapshot its heartbeat writes to ``<ns>:worker:<name>``.

``rewardq status``, ``rewardq top`` and ``rewardq health`` read it. :class:`Presence` keeps what
the snapshot needs beyond the worker's counters: when the worker started, the latencies and
output counts of the trajectories scored in the last minute (for the rates, which the fleet's
backlog drain time is computed from, and the median latency), and each data source's scoring
time over the last minute (``rewardq top``'s slowest data sources), the error results it wrote by
data source and failure kind, and the trajectories waiting on a retry (and why).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from rewardq import defaults

#: The worker's counters, in the order its heartbeat publishes them.
COUNTERS = (
    "read",
    "stored",
    "parked",
    "scored",
    "errors",
    "dead_letters",
    "reclaimed",
    "duplicates",
    "expired",
    "retries",
)
#: Data sources whose failures a heartbeat counts by name; the others are counted under ``(other)``.
FAILURE_SOURCES = 64


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
        self.scoring = ""  # the digest of the worker's scoring configuration (rewardq.consumers.fleet)
        self._recent: deque[tuple[float, float, int]] = deque(maxlen=4096)  # (time, latency_ms, outputs)
        self._sources: deque[tuple[float, str, float]] = deque(maxlen=4096)  # (time, data source, seconds)
        self.failures: dict[str, dict[str, int]] = {}  # data source -> failure kind -> error results
        self.retrying: dict[str, Any] = {"n": 0, "waiting": []}  # what waits on a retry (Retries.snapshot)

    def scored(self, latency_ms: float | None, outputs: int = 1) -> None:
        """Count a trajectory of ``outputs`` outputs scored now, ``latency_ms`` after its producer sent it."""
        self._recent.append((time.time(), -1.0 if latency_ms is None else latency_ms, outputs))

    def finished(self, data_source: str, seconds: float) -> None:
        """Record how long one trajectory of ``data_source`` took to score and commit (any outcome)."""
        self._sources.append((time.time(), data_source or "unknown", seconds))

    def failed(self, data_source: str, kind: str) -> None:
        """Count an error result of failure ``kind`` for ``data_source`` (since the worker started)."""
        ds = data_source or "unknown"
        if ds not in self.failures and len(self.failures) >= FAILURE_SOURCES:
            ds = "(other)"
        by_kind = self.failures.setdefault(ds, {})
        by_kind[kind] = by_kind.get(kind, 0) + 1

    def sources(
        self, now: float, window: float = defaults.SOURCES_WINDOW_S, limit: int = defaults.SOURCES_LIMIT
    ) -> dict[str, dict[str, float]]:
        """The last ``window`` seconds per data source: ``{ds: {"n", "mean_s", "max_s"}}``, the
        ``limit`` slowest by mean."""
        acc: dict[str, list[float]] = {}
        for t, ds, sec in self._sources:
            if now - t <= window:
                acc.setdefault(ds, []).append(sec)
        stats = {
            ds: {"n": len(v), "mean_s": round(sum(v) / len(v), 4), "max_s": round(max(v), 4)} for ds, v in acc.items()
        }
        slowest = sorted(stats, key=lambda ds: -stats[ds]["mean_s"])[:limit]
        return {ds: stats[ds] for ds in slowest}

    def snapshot(self, code: Any = None) -> dict[str, Any]:
        """Counters, in-flight work, rates (trajectories and outputs per second, last 10 s), median
        latency (last 60 s) and scoring time per data source; ``code``: the manager's
        code-execution counters, if any."""
        now = time.time()
        recent = [lat for t, lat, _ in self._recent if now - t <= 60 and lat >= 0]
        window = [n for t, _, n in self._recent if now - t <= 10]
        sources = self.sources(now)
        return {
            **({"code": json.dumps(code.snapshot())} if code is not None and code.sources else {}),
            **({"sources": json.dumps(sources)} if sources else {}),
            **({"failures": json.dumps(self.failures)} if self.failures else {}),
            "retrying": json.dumps(self.retrying),
            **self.stats,
            "in_flight": len(self.in_flight),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "manager": self.manager_name,
            "scoring": self.scoring,
            "started_at": f"{self.started_at:.3f}",
            "rate": round(len(window) / 10.0, 3),
            "outputs_rate": round(sum(window) / 10.0, 3),
            "latency_p50_ms": round(sorted(recent)[len(recent) // 2], 3) if recent else "",
            "in_flight_tids": ",".join(list(self.in_flight)[:20]),
        }
