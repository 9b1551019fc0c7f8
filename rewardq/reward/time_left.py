"""What is left of the current trajectory's scoring budget, for code that waits on its behalf.

The worker runs each trajectory under a budget of ``score_timeout`` seconds
(:mod:`rewardq.reward.execution.budget`, which keeps it in :data:`CURRENT`). Code that would sleep
for a limit or a retry (the fleet rate limiter, the judge's ``Retry-After``) asks :func:`time_left`
first, so it can say "this limit holds the call past score_timeout" at once instead of sleeping
into a timeout that names nothing. This module is apart from the budget's machinery so that the
limiter and the judge, which the manager contract loads, do not load it.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

#: The current trajectory's :class:`~rewardq.reward.execution.budget.ScoringBudget`, if any (tasks the
#: manager starts share it).
CURRENT: ContextVar[Any] = ContextVar("rewardq_scoring_budget", default=None)


@dataclass(frozen=True)
class TimeLeft:
    """``seconds`` left of a trajectory's budget of ``budget`` seconds (``score_timeout``)."""

    seconds: float
    budget: float


def time_left() -> TimeLeft | None:
    """What is left of the current trajectory's budget; None when no trajectory is being scored in
    this context, or while its clock stands still (it waits for a scorer process)."""
    budget = CURRENT.get()
    if budget is None or budget.deadline is None:
        return None
    return TimeLeft(max(0.0, budget.remaining()), budget.seconds)
