"""The failure budget of one verl run, counted once in Redis for every adapter and hook process.

An error result is never a reward, but a fleet that fails everything (a judge that is down, a
scorer that raises on every response) must not leave a run training on what little is left.
:class:`FleetBudget` records every trajectory's outcome (``ok`` or its failure kind) in the run's
window in Redis (:class:`rewardq.queue.failure_budget.OutcomeWindow`): one window per run and
namespace, shared by every process that scores, so ``verl_error_window`` means the same with 1 or 8
reward-loop actors. A failure that leaves more than ``max_rate`` of the run's last ``window``
trajectories failed stops the run with :class:`~rewardq.errors.RunStopped`, whose message counts
the window's failures by kind and quotes the last one.

It never stops before the window has filled (a run's first few trajectories cannot stop it by
chance), and never on a scored trajectory: once the cause is fixed, good trajectories go on and
push the failures out of the window. The run is the Ray job every verl process of it belongs to
(``local`` outside Ray).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rewardq.errors import RunStopped
from rewardq.queue.states import FailureKind

if TYPE_CHECKING:
    from rewardq.queue.failure_budget import OutcomeWindow

#: How much of the last error message the budget's error quotes.
LAST_ERROR_CHARS = 500
#: What a trajectory came to: scored, one of the failure kinds, or an error result of a worker that
#: wrote no kind.
OK = "ok"
UNKNOWN = "unknown"
#: The kind of a trajectory its producer cancelled (``status="cancelled"``): no reward and no
#: failure, so never counted here (it is left out of training, as a masked sample is).
CANCELLED = "cancelled"
LABELS = (OK, *(k.value for k in FailureKind), UNKNOWN)


@dataclass(frozen=True)
class Failure:
    """Why one trajectory got no reward: the message, and its kind (a :class:`FailureKind` value or
    ``unknown``)."""

    message: str
    kind: str = UNKNOWN


def current_run() -> str:
    """The run the budget is counted for: the Ray job of this process (every actor of a verl run
    belongs to its driver's job), or ``local`` outside Ray."""
    ray = sys.modules.get("ray")  # imported by every verl process; never imported here for nothing
    if ray is not None and ray.is_initialized():
        return str(ray.get_runtime_context().get_job_id())
    return "local"


class FleetBudget:
    """The run's failure budget; :meth:`record` stops the run once too many of its trajectories failed.

    Args:
        max_rate: largest share of failures the window may hold (``1`` never stops).
        window: how many of the run's last trajectories the share is taken over.
        settings_hint: named in the error: which settings set the two numbers.
    """

    def __init__(self, max_rate: float, window: int, settings_hint: str = "") -> None:
        self.max_rate = max_rate
        self.window = window
        self.settings_hint = settings_hint

    async def record(self, store: OutcomeWindow, failure: Failure | None) -> None:
        """Count one trajectory (``failure``: why it got no reward, None when it was scored).

        Raises:
            RunStopped: it failed, the window is full, and more than ``max_rate`` of it failed.
        """
        if failure is not None and failure.kind == CANCELLED:
            return  # nothing failed: nobody wanted it scored
        filled, counts = await store.record(OK if failure is None else failure.kind, self.window)
        failed = filled - counts[OK]
        if failure is None or filled < self.window or failed <= self.max_rate * self.window:
            return
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])
        by_kind = ", ".join(f"{n} {kind}" for kind, n in ranked if n and kind != OK)
        hint = f" ({self.settings_hint})" if self.settings_hint else ""
        raise RunStopped(
            f"rewardq: {failed} of the run's last {self.window} trajectories got no reward (counted across every "
            f"adapter and hook process of the run), more than verl_max_error_rate={self.max_rate:g} allows{hint}: "
            f"{by_kind}. Training on would train on what little the fleet still scores. Fix the cause "
            "(`rewardq status`, `rewardq dead-letters list`), or raise the limit. "
            f"The last error ({failure.kind}): {failure.message[:LAST_ERROR_CHARS]}"
        )
