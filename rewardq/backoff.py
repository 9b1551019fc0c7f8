"""The one backoff of rewardq: how long to pause before the next try, for every loop that retries.

:func:`compute_backoff` serves the Redis retry policy (:func:`rewardq.queue.retry.backoff_delay`,
which the worker's reader and its wait for Redis at start-up use too), the supervisor's restarts of
dead worker processes, and the worker's retries in place of a trajectory whose scoring failed for
a transient reason (:mod:`rewardq.consumers.retries`: a judge, reward model or SandboxFusion that
is down; their clients never retry themselves), as dramatiq's one ``compute_backoff`` serves its
retries, broker and results alike. ``growth="linear"`` is verl's SandboxFusion schedule (retry
``k`` waits ``k * base``), for a loop that must pace as verl does.

A standard-library module, so every layer (``queue/`` included) may
use it. A library (tenacity, backoff) would own the loop as well as the pause; ours stay where
they are, each with its own rule for what to retry, and take only the pause from here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Literal

__all__ = ["Growth", "compute_backoff"]

#: ``exponential``: ``base * 2**(attempt - 1)``; ``linear``: ``base * attempt`` (verl's SandboxFusion).
Growth = Literal["exponential", "linear"]


def compute_backoff(
    attempt: int,
    *,
    base: float,
    cap: float = math.inf,
    growth: Growth = "exponential",
    jitter: float = 0.0,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to pause before retry number ``attempt`` (1 is the first retry, after one failure).

    Args:
        attempt: failures so far in a row (values below 1 count as 1).
        base: the first pause.
        cap: the longest pause (before jitter).
        growth: ``exponential`` doubles the pause with each failure; ``linear`` adds ``base``.
        jitter: the share of the pause drawn at random, from 0 (none: every pause is the step) to 1:
            the pause is ``step * (1 - jitter * r)`` for ``r`` uniform in [0, 1). ``0.5`` is "equal
            jitter" (half fixed, half random), so that many clients do not retry in step.
        rand: the source of ``r`` (tests pass a fixed one).
    """
    if base < 0 or not 0 <= jitter <= 1:
        raise ValueError(f"backoff needs base >= 0 and jitter in [0, 1], got base={base!r}, jitter={jitter!r}")
    n = max(1, attempt)
    if growth == "linear":
        step = base * n
    elif growth == "exponential":
        step = base * 2.0 ** min(n - 1, 1023)  # 2**1024 overflows a float; any cap is reached long before
    else:
        raise ValueError(f"backoff growth must be exponential or linear, got {growth!r}")
    return min(cap, step) * (1 - jitter * rand())
