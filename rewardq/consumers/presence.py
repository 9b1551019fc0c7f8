"""What a worker says about itself: the snapshot its heartbeat writes to ``<ns>:worker:<name>``.

``rewardq status``, ``rewardq top`` and ``rewardq health`` read it. :class:`Presence` keeps what
the snapshot needs beyond the worker's counters: when the worker started, how many trajectories
and outputs it scored in each second of the last minute (for the rates, which the fleet's backlog
drain time is computed from) with a sample of their latencies (for the median), and each data
source's scoring time over the last minute (``rewardq top``'s slowest data sources), the error
results it wrote by data source and failure kind, and the trajectories waiting on a retry (and why).

The last minute is kept as one bucket of counters per second, so the rates and counts are exact
at any speed, in memory bounded by the window, not by the traffic.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rewardq.queue.states import NO_DATA_SOURCE

#: Seconds of scoring time per data source a heartbeat summarises, and how many sources it keeps.
SOURCES_WINDOW_S = 60.0
SOURCES_LIMIT = 20


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
    "redis_full",
    "no_room",
    "stage_waits",
    "cancelled",
)
#: Data sources whose failures a heartbeat counts by name; the others are counted under ``(other)``.
FAILURE_SOURCES = 64
#: Seconds of history kept (the longest window a snapshot reports: median latency, data sources).
HISTORY_S = 60
#: Seconds the published rates cover.
RATE_WINDOW_S = 10
#: Latencies kept per second for the median (a uniform sample of that second's trajectories).
LATENCY_SAMPLES_PER_S = 64
#: Data sources timed by name per second; the others are timed under ``(other)``.
SOURCES_PER_S = 64


@dataclass
class _Second:
    """What was scored in one second: counts, a latency sample, and scoring time per data source."""

    at: int
    trajectories: int = 0
    outputs: int = 0
    latencies: list[float] = field(default_factory=list)
    timed: int = 0  # latencies offered to the sample
    sources: dict[str, list[float]] = field(default_factory=dict)  # data source -> [n, total_s, max_s]

    def latency(self, ms: float) -> None:
        """Reservoir sampling: each latency of this second is kept with the same chance."""
        self.timed += 1
        if len(self.latencies) < LATENCY_SAMPLES_PER_S:
            self.latencies.append(ms)
        else:
            j = random.randrange(self.timed)
            if j < LATENCY_SAMPLES_PER_S:
                self.latencies[j] = ms

    def source(self, ds: str, seconds: float) -> None:
        if ds not in self.sources and len(self.sources) >= SOURCES_PER_S:
            ds = "(other)"
        acc = self.sources.setdefault(ds, [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += seconds
        acc[2] = max(acc[2], seconds)


class Presence:
    """The worker's heartbeat snapshot.

    Args:
        manager_name: the manager the worker runs.
        stats: the worker's counters, published as they are.
        in_flight: the worker's held trajectories by id.
    """

    def __init__(
        self,
        *,
        manager_name: str,
        stats: Mapping[str, int],
        in_flight: Mapping[str, object],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.manager_name = manager_name
        self.stats = stats
        self.in_flight = in_flight
        self.clock = clock
        self.started_at = clock()
        self.scoring = ""  # the digest of the worker's scoring configuration (rewardq.consumers.scoring_gate)
        self._seconds: deque[_Second] = deque()  # the last HISTORY_S seconds, oldest first
        self.failures: dict[str, dict[str, int]] = {}  # data source -> failure kind -> error results
        self.retrying: dict[str, Any] = {"n": 0, "waiting": []}  # what waits on a retry (Retries.snapshot)

    def _now(self) -> _Second:
        """The bucket of the current second (older ones past :data:`HISTORY_S` dropped)."""
        at = int(self.clock())
        if not self._seconds or self._seconds[-1].at != at:
            self._seconds.append(_Second(at))
            while self._seconds[0].at <= at - HISTORY_S:
                self._seconds.popleft()
        return self._seconds[-1]

    def scored(self, latency_ms: float | None, outputs: int = 1) -> None:
        """Count a trajectory of ``outputs`` outputs scored now, ``latency_ms`` after its producer sent it."""
        second = self._now()
        second.trajectories += 1
        second.outputs += outputs
        if latency_ms is not None and latency_ms >= 0:
            second.latency(latency_ms)

    def finished(self, data_source: str, seconds: float) -> None:
        """Record how long one trajectory of ``data_source`` took to score and commit (any outcome)."""
        self._now().source(data_source or NO_DATA_SOURCE, seconds)

    def _window(self, now: float, seconds: float) -> tuple[list[_Second], float]:
        """The buckets of the last ``seconds`` whole seconds up to ``now`` (the current one, partly
        gone, included) and the time they span."""
        first = int(now) - int(seconds) + 1
        span = min(max(now - max(first, self.started_at), 1.0), float(seconds))
        return [b for b in self._seconds if first <= b.at <= now], span

    def rates(self, now: float | None = None) -> tuple[float, float]:
        """Trajectories and outputs scored per second over the last :data:`RATE_WINDOW_S` seconds."""
        now = self.clock() if now is None else now
        buckets, span = self._window(now, RATE_WINDOW_S)
        return sum(b.trajectories for b in buckets) / span, sum(b.outputs for b in buckets) / span

    def failed(self, data_source: str, kind: str) -> None:
        """Count an error result of failure ``kind`` for ``data_source`` (since the worker started)."""
        ds = data_source or NO_DATA_SOURCE
        if ds not in self.failures and len(self.failures) >= FAILURE_SOURCES:
            ds = "(other)"
        by_kind = self.failures.setdefault(ds, {})
        by_kind[kind] = by_kind.get(kind, 0) + 1

    def sources(
        self, now: float, window: float = SOURCES_WINDOW_S, limit: int = SOURCES_LIMIT
    ) -> dict[str, dict[str, float]]:
        """The last ``window`` seconds per data source: ``{ds: {"n", "mean_s", "max_s"}}``, the
        ``limit`` slowest by mean."""
        acc: dict[str, list[float]] = {}
        for b in self._window(now, window)[0]:
            for ds, (n, total, longest) in b.sources.items():
                have = acc.setdefault(ds, [0, 0.0, 0.0])
                have[0] += n
                have[1] += total
                have[2] = max(have[2], longest)
        stats = {
            ds: {"n": int(n), "mean_s": round(total / n, 4), "max_s": round(longest, 4)}
            for ds, (n, total, longest) in acc.items()
        }
        slowest = sorted(stats, key=lambda ds: -stats[ds]["mean_s"])[:limit]
        return {ds: stats[ds] for ds in slowest}

    def snapshot(self, code: Any = None) -> dict[str, Any]:
        """Counters, in-flight work, rates (trajectories and outputs per second, last 10 s), median
        latency (last 60 s, over a sample of at most :data:`LATENCY_SAMPLES_PER_S` a second) and
        scoring time per data source; ``code``: the manager's code-execution counters, if any."""
        now = self.clock()
        self._now()  # drops what has left the history
        p50 = _weighted_median(self._window(now, HISTORY_S)[0])
        rate, outputs_rate = self.rates(now)
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
            "rate": round(rate, 3),
            "outputs_rate": round(outputs_rate, 3),
            "latency_p50_ms": "" if p50 is None else round(p50, 3),
            "in_flight_tids": ",".join(list(self.in_flight)[:20]),
        }


def _weighted_median(seconds: list[_Second]) -> float | None:
    """The median latency of the trajectories of ``seconds``, each second's sample standing for all
    of that second's trajectories (a busy second weighs as much as it scored)."""
    weighted = sorted((ms, b.timed / len(b.latencies)) for b in seconds for ms in b.latencies)
    half = sum(w for _, w in weighted) / 2
    seen = 0.0
    for ms, w in weighted:
        seen += w
        if seen >= half:
            return ms
    return None
