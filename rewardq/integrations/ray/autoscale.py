"""How many workers a fleet needs for its backlog to drain within a target time.

:class:`Autoscale` is the policy a user gives ``start_fleet(..., autoscale=...)``;
:class:`Autoscaler` applies it to the figures of :func:`rewardq.queue.reads.backlog_status`
(entries not yet given to a worker, the live workers' measured outputs per second). No Ray here:
the fleet handle (:mod:`rewardq.integrations.ray.fleet`) polls the figures and calls :meth:`Autoscaler.decide`.

The rule, checked every ``interval_s``:

* **measured rate per worker** = the fleet's outputs per second / live workers;
* **wanted** = ``ceil(backlog / (rate per worker * target_drain_s))``, within ``[min_workers,
  max_workers]``; an empty backlog wants ``min_workers``; a backlog with nothing measured yet
  (workers still starting, or none at all) keeps the fleet as it is, and at least one worker;
* **up at once, down slowly**: more workers are added as soon as they are wanted; workers are
  removed only after fewer have been wanted for ``scale_down_after_s`` seconds, and then down to
  the largest number wanted during that time (as Kubernetes' HPA stabilises scale-downs), so a
  burst that pauses for a moment does not lose the workers it is about to need again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rewardq.errors import ConfigError

__all__ = ["Autoscale", "Autoscaler"]

#: Autoscaling: the fewest and the most workers it keeps.
AUTOSCALE_MIN_WORKERS = 1
AUTOSCALE_MAX_WORKERS = 16
#: Autoscaling: seconds the backlog should take to drain at the fleet's measured rate.
AUTOSCALE_TARGET_DRAIN_S = 60.0
#: Autoscaling: seconds between two decisions.
AUTOSCALE_INTERVAL_S = 10.0
#: Autoscaling: seconds fewer workers must be wanted before one is removed.
AUTOSCALE_SCALE_DOWN_AFTER_S = 60.0


@dataclass(frozen=True)
class Autoscale:
    """An autoscaling policy for a Ray fleet (see the module docstring).

    Args:
        min_workers: never fewer workers (0 allowed: an idle fleet stops every worker; one is
            started again when entries wait and nothing scores them).
        max_workers: never more workers.
        target_drain_s: the backlog should drain within this many seconds at the measured rate.
        interval_s: seconds between two decisions.
        scale_down_after_s: seconds fewer workers must be wanted before any is removed.
    """

    min_workers: int = AUTOSCALE_MIN_WORKERS
    max_workers: int = AUTOSCALE_MAX_WORKERS
    target_drain_s: float = AUTOSCALE_TARGET_DRAIN_S
    interval_s: float = AUTOSCALE_INTERVAL_S
    scale_down_after_s: float = AUTOSCALE_SCALE_DOWN_AFTER_S

    def __post_init__(self) -> None:
        if self.min_workers < 0 or self.max_workers < max(1, self.min_workers):
            raise ConfigError(
                f"autoscale: need 0 <= min_workers <= max_workers and max_workers >= 1, got "
                f"min_workers={self.min_workers}, max_workers={self.max_workers}"
            )
        for name in ("target_drain_s", "interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"autoscale: {name} must be positive, got {getattr(self, name)!r}")
        if self.scale_down_after_s < 0:
            raise ConfigError(f"autoscale: scale_down_after_s must be >= 0, got {self.scale_down_after_s!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> Autoscale:
        """A policy from a config block (``{"min_workers": 1, "max_workers": 8, "target_drain_s": 30}``;
        ``min``/``max`` are accepted as short names)."""
        aliases = {"min": "min_workers", "max": "max_workers", "target": "target_drain_s"}
        known = {f for f in cls.__dataclass_fields__}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            name = aliases.get(str(key), str(key))
            if name not in known:
                raise ConfigError(f"autoscale: unknown setting {key!r}; known: {sorted(known)}")
            kwargs[name] = value
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"autoscale: {exc}") from None

    def wanted(self, current: int, figures: Mapping[str, Any]) -> int:
        """Workers the figures call for right now (before the scale-down stabilisation)."""
        entries, rate, alive = int(figures["entries"]), float(figures["outputs_per_s"]), int(figures["workers"])
        if entries <= 0:
            want = self.min_workers
        elif rate <= 0 or alive <= 0:
            want = max(current, 1)
        else:
            per_worker = rate / alive
            want = math.ceil(entries / (per_worker * self.target_drain_s))
        return max(self.min_workers, min(self.max_workers, want))


@dataclass
class Autoscaler:
    """Applies an :class:`Autoscale` policy over time: up at once, down after the stabilisation window."""

    policy: Autoscale
    _wants: deque[tuple[float, int]] = field(default_factory=deque)
    last: dict[str, Any] = field(default_factory=dict)

    def decide(self, now: float, current: int, figures: Mapping[str, object]) -> int:
        """The fleet size to have now, given ``current`` workers and the backlog ``figures``."""
        want = self.policy.wanted(current, figures)
        window = self.policy.scale_down_after_s
        self._wants.append((now, want))
        # keep the wants of the last `window` seconds, and the one just before them (the history then
        # covers the whole window once the autoscaler has run that long)
        while len(self._wants) > 1 and now - self._wants[1][0] >= window:
            self._wants.popleft()
        if want >= current:
            target = want
        elif now - self._wants[0][0] >= window:
            target = min(current, max(w for _, w in self._wants))
        else:
            target = current
        self.last = {"time": now, "wanted": want, "target": target, "current": current, **dict(figures)}
        return target
