"""A trajectory's scoring budget (``score_timeout``), whose clock stops while it waits for a place.

The worker gives each trajectory ``score_timeout`` seconds
(:class:`~rewardq.consumers.scorer.TrajectoryScorer` runs the manager under
:func:`run_within_budget`). What the budget counts is the trajectory's own work: while one of
its calls waits for a scorer process or a scoring thread (every one busy, perhaps with hung
calls of other trajectories), its clock stands still (:func:`waiting_for_a_place`), so a good
trajectory never times out for queueing behind bad ones. When several of its calls wait at
once, the clock stands still while any of them waits.

A call that runs is bounded on its own as well: the scorer pool kills a call that runs longer
than the budget from the moment its process took it (:meth:`ScorerPool.run`'s ``timeout``), so
a clock held still by a waiting neighbour never lets a hung call run on.

The budget reaches the code that waits through a context variable
(:data:`rewardq.reward.time_left.CURRENT`): tasks the manager starts (``asyncio.gather`` over rows)
share their trajectory's budget.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from rewardq.reward.time_left import CURRENT

T = TypeVar("T")

_current: ContextVar[ScoringBudget | None] = CURRENT


class ScoringBudget:
    """``seconds`` of scoring time, counted only while none of the trajectory's calls waits for a place.

    Attributes:
        seconds: the whole budget.
        waited: seconds the clock has stood still so far.
    """

    def __init__(self, seconds: float, loop: asyncio.AbstractEventLoop) -> None:
        self.seconds = float(seconds)
        self.waited = 0.0
        self._loop = loop
        self._deadline = loop.time() + self.seconds
        self._waiters = 0
        self._stopped_at: float | None = None
        self.changed = asyncio.Event()  # set whenever the clock stops or starts again
        self._timeout: Any = None  # the asyncio.Timeout it reschedules (Python 3.11+)

    @property
    def deadline(self) -> float | None:
        """When the budget runs out, in the loop's time; None while the clock stands still."""
        return None if self._stopped_at is not None else self._deadline

    def remaining(self) -> float:
        """Seconds left (while the clock stands still: what was left when it stopped)."""
        now = self._stopped_at if self._stopped_at is not None else self._loop.time()
        return self._deadline - now

    def stop(self) -> None:
        """A call starts waiting for a place: the clock stops unless the budget is already spent."""
        self._waiters += 1
        if self._waiters == 1 and self.remaining() > 0:
            self._stopped_at = self._loop.time()
            self._moved()

    def go(self) -> None:
        """A waiting call got its place (or gave up): the clock runs again once none waits."""
        self._waiters -= 1
        if self._waiters == 0 and self._stopped_at is not None:
            stood = self._loop.time() - self._stopped_at
            self.waited += stood
            self._deadline += stood
            self._stopped_at = None
            self._moved()

    def _moved(self) -> None:
        self.changed.set()
        timeout = self._timeout
        if timeout is not None and not timeout.expired():
            timeout.reschedule(self.deadline)


def current_budget() -> ScoringBudget | None:
    """The budget of the trajectory being scored in this context, if any."""
    return _current.get()


@contextlib.contextmanager
def waiting_for_a_place() -> Iterator[ScoringBudget | None]:
    """Stop the current trajectory's clock (if there is one) while the body waits for a place."""
    budget = _current.get()
    if budget is None:
        yield None
        return
    budget.stop()
    try:
        yield budget
    finally:
        budget.go()


async def run_within_budget(coro: Awaitable[T], seconds: float, *, own_task: bool | None = None) -> T:
    """``await coro`` with a :class:`ScoringBudget` of ``seconds``; raises ``asyncio.TimeoutError``
    once the budget is spent.

    On Python 3.11+ the coroutine runs in the calling task under ``asyncio.timeout_at``, which the
    budget reschedules. Python 3.10 (``own_task=True``, which tests can ask for) runs it in a
    task of its own, watched until it ends or the budget is spent.
    """
    loop = asyncio.get_running_loop()
    budget = ScoringBudget(seconds, loop)
    timeout_at = getattr(asyncio, "timeout_at", None)
    if own_task or timeout_at is None:
        return await _watched(coro, budget)
    token = _current.set(budget)
    try:
        async with timeout_at(budget.deadline) as scope:
            budget._timeout = scope
            return await coro
    finally:
        budget._timeout = None
        _current.reset(token)


async def _watched(coro: Awaitable[T], budget: ScoringBudget) -> T:
    token = _current.set(budget)
    try:
        inner = asyncio.ensure_future(coro)  # the task copies the context: it sees the budget
    finally:
        _current.reset(token)
    try:
        while True:
            budget.changed.clear()
            changed = asyncio.ensure_future(budget.changed.wait())
            deadline = budget.deadline
            left = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
            try:
                await asyncio.wait({inner, changed}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
            if inner.done():
                return inner.result()
            if budget.deadline is not None and budget.remaining() <= 0:
                inner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await inner
                raise asyncio.TimeoutError
    except asyncio.CancelledError:
        inner.cancel()
        raise
