"""Live reward health: per data source, the recent mean reward, error share by kind and p99 latency,
and a warning when the reward or the error share jumps sharply.

Each worker keeps, per data source, 10-second buckets of what it finished (:class:`RewardHealth`):
trajectories, the sum and sum of squares of their rewards, errors by ``failure_kind``, and a
latency histogram on fixed log-spaced bounds, for the last ``RECENT + BASELINE`` seconds. Its
heartbeat publishes two windows (:meth:`RewardHealth.snapshot`): **recent**, the last
``RECENT`` = 60 s, and **baseline**, the ``BASELINE`` = 10 minutes before it. Windows of several
workers add up exactly (:func:`merge`), so ``rewardq status`` and ``rewardq top`` judge the whole
fleet (:func:`judge`), and each worker's ``/metrics`` its own.

**Sharply**, for one data source, means all of (:func:`jumps`):

* enough to judge: at least ``MIN_RECENT`` = 20 trajectories in the recent window and
  ``MIN_BASELINE`` = 50 in the baseline;
* **mean reward**: it moved by at least ``max(0.05, half the baseline's standard deviation)``, and
  by at least 4 standard errors (``|m_r - m_b| / (s_b * sqrt(1/n_r + 1/n_b)) >= 4``);
* **error share**: it rose by at least 10 percentage points, and by at least 4 standard errors of
  the difference of two proportions (the pooled share's).

Four standard errors is a one-in-15,000 event for a steady source (a normal tail), and the
absolute floors keep a huge window from flagging a shift nobody cares about: a steady run stays
quiet. A source that changes for real (a broken scorer, a judge down, a new dataset shard) shows
up within one window.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rewardq.queue.states import NO_DATA_SOURCE

#: Seconds of the recent window, and of the baseline before it.
RECENT, BASELINE = 60.0, 600.0
#: Width of one bucket, in seconds.
BUCKET = 10.0
#: Fewest trajectories in the recent window / the baseline for a jump to be judged.
MIN_RECENT, MIN_BASELINE = 20, 50
#: Standard errors a change must pass to count as a jump.
Z = 4.0
#: Absolute floors: the mean reward must move this much (or half the baseline's standard
#: deviation, if more); the error share must rise this much.
REWARD_FLOOR, ERROR_FLOOR = 0.05, 0.10
#: Data sources one worker tracks; more are counted under ``(other)``.
MAX_SOURCES = 64
#: Upper bounds of the latency histogram's buckets, in ms (log-spaced, 1 ms to ~17 min; one more
#: bucket above the last).
LATENCY_BOUNDS = tuple(round(10 ** (k / 8), 3) for k in range(0, 49))


@dataclass
class Window:
    """What finished in a window, for one data source (adds up across workers and buckets)."""

    n: int = 0
    scored: int = 0  # ok trajectories with a reward
    total: float = 0.0
    squares: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))

    def add(self, other: Window) -> None:
        self.n += other.n
        self.scored += other.scored
        self.total += other.total
        self.squares += other.squares
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v
        self.latency = [a + b for a, b in zip(self.latency, other.latency)]

    @property
    def mean(self) -> float | None:
        return self.total / self.scored if self.scored else None

    @property
    def std(self) -> float | None:
        if not self.scored:
            return None
        m = self.total / self.scored
        return math.sqrt(max(0.0, self.squares / self.scored - m * m))

    @property
    def error_share(self) -> float:
        return sum(self.errors.values()) / self.n if self.n else 0.0

    def p99_ms(self) -> float | None:
        """The 99th percentile latency, as its histogram bucket's upper bound (None: no latency)."""
        total = sum(self.latency)
        if not total:
            return None
        need, seen = math.ceil(0.99 * total), 0
        for i, c in enumerate(self.latency):
            seen += c
            if seen >= need:
                return LATENCY_BOUNDS[min(i, len(LATENCY_BOUNDS) - 1)]
        return LATENCY_BOUNDS[-1]

    def as_dict(self) -> dict[str, object]:
        return {
            "n": self.n,
            "scored": self.scored,
            "total": round(self.total, 9),
            "squares": round(self.squares, 9),
            "errors": dict(self.errors),
            "latency": list(self.latency),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Window:
        w = cls()
        try:
            w.n, w.scored = int(d.get("n", 0)), int(d.get("scored", 0))
            w.total, w.squares = float(d.get("total", 0.0)), float(d.get("squares", 0.0))
            w.errors = {str(k): int(v) for k, v in (d.get("errors") or {}).items()}
            latency = [int(x) for x in d.get("latency") or []]
            if len(latency) == len(w.latency):
                w.latency = latency
        except (TypeError, ValueError, AttributeError):
            return cls()
        return w


def _latency_bucket(ms: float) -> int:
    for i, bound in enumerate(LATENCY_BOUNDS):
        if ms <= bound:
            return i
    return len(LATENCY_BOUNDS)


class RewardHealth:
    """One worker's buckets (see the module doc)."""

    def __init__(self, clock: Any = time.time) -> None:
        self.clock = clock
        self._buckets: dict[str, deque[tuple[float, Window]]] = {}

    def record(
        self, data_source: str, *, reward: float | None, failure_kind: str | None, latency_ms: float | None
    ) -> None:
        """One trajectory finished: its reward (ok), or its failure kind (error), and its latency."""
        ds = data_source or NO_DATA_SOURCE
        if ds not in self._buckets and len(self._buckets) >= MAX_SOURCES:
            ds = "(other)"
        now = self.clock()
        start = now - now % BUCKET
        buckets = self._buckets.setdefault(ds, deque())
        if not buckets or buckets[-1][0] != start:
            buckets.append((start, Window()))
            while buckets and buckets[0][0] < now - RECENT - BASELINE - BUCKET:
                buckets.popleft()
        w = buckets[-1][1]
        w.n += 1
        if failure_kind is not None:
            w.errors[failure_kind] = w.errors.get(failure_kind, 0) + 1
        elif reward is not None and math.isfinite(reward):
            w.scored += 1
            w.total += reward
            w.squares += reward * reward
        if latency_ms is not None and latency_ms >= 0:
            w.latency[_latency_bucket(latency_ms)] += 1

    def windows(self) -> dict[str, tuple[Window, Window]]:
        """Per data source, its (recent, baseline) windows now."""
        now = self.clock()
        out = {}
        for ds, buckets in self._buckets.items():
            recent, base = Window(), Window()
            for start, w in buckets:
                if start + BUCKET > now - RECENT:
                    recent.add(w)
                elif start + BUCKET > now - RECENT - BASELINE:
                    base.add(w)
            if recent.n or base.n:
                out[ds] = (recent, base)
        return out

    def snapshot(self) -> dict[str, Any]:
        """What the heartbeat publishes: ``{data source: {"recent": ..., "baseline": ...}}``."""
        return {ds: {"recent": r.as_dict(), "baseline": b.as_dict()} for ds, (r, b) in self.windows().items()}


def merge(snapshots: Iterable[Mapping[str, object]]) -> dict[str, tuple[Window, Window]]:
    """Several workers' snapshots added up, per data source."""
    out: dict[str, tuple[Window, Window]] = {}
    for snap in snapshots:
        for ds, windows in (snap or {}).items():
            if not isinstance(windows, Mapping):
                continue
            recent, base = out.setdefault(str(ds), (Window(), Window()))
            recent.add(Window.from_dict(windows.get("recent") or {}))
            base.add(Window.from_dict(windows.get("baseline") or {}))
    return out


def jumps(recent: Window, base: Window) -> list[str]:
    """What jumped sharply from the baseline to the recent window (see the module doc)."""
    if recent.n < MIN_RECENT or base.n < MIN_BASELINE:
        return []
    out = []
    if recent.mean is not None and base.mean is not None and recent.scored and base.scored:
        diff = recent.mean - base.mean
        spread = base.std or 0.0
        floor = max(REWARD_FLOOR, 0.5 * spread)
        se = spread * math.sqrt(1 / recent.scored + 1 / base.scored)
        if abs(diff) >= floor and (se == 0 or abs(diff) / se >= Z):
            out.append(f"mean reward {base.mean:.3f} -> {recent.mean:.3f}")
    p_r, p_b = recent.error_share, base.error_share
    pooled = (p_r * recent.n + p_b * base.n) / (recent.n + base.n)
    se = math.sqrt(pooled * (1 - pooled) * (1 / recent.n + 1 / base.n))
    if p_r - p_b >= ERROR_FLOOR and (se == 0 or (p_r - p_b) / se >= Z):
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(recent.errors.items()))
        out.append(f"error share {p_b:.1%} -> {p_r:.1%} ({kinds})")
    return out


def judge(windows: Mapping[str, tuple[Window, Window]]) -> list[dict[str, Any]]:
    """One row per data source for status and top: recent mean reward, error share by kind, p99
    latency, the baseline's mean and error share, and what jumped (empty on a steady run)."""
    rows = []
    for ds, (recent, base) in sorted(windows.items(), key=lambda kv: -kv[1][0].n):
        rows.append(
            {
                "data_source": ds,
                "trajectories": recent.n,
                "mean_reward": recent.mean,
                "error_share": recent.error_share,
                "errors_by_kind": {k: v / recent.n for k, v in sorted(recent.errors.items())} if recent.n else {},
                "p99_ms": recent.p99_ms(),
                "baseline_trajectories": base.n,
                "baseline_mean_reward": base.mean,
                "baseline_error_share": base.error_share,
                "jumps": jumps(recent, base),
            }
        )
    return rows
