"""Wake a rate limiter's waiters when tokens come back, instead of letting them sleep out a refill.

Why: a judge call reserves its estimated tokens before it goes and hands back what it did not use
when its answer arrives (or all of them when it is cancelled). A waiter that computed its wait
from the refill rate alone sleeps through every hand-back: with an estimate five times the real
use, the fleet got a fifth of ``max_tpm``. Two mechanisms keep hand-backs in use:

* **In this process, a doorbell.** A hand-back rings it, and the waiter that has slept longest wakes
  and asks the bucket again. A waiter that gets its tokens rings it again, so the next one looks at
  what is left; one ring wakes one waiter, so a hand-back never sends a herd to Redis.
* **From other processes, bounded re-polls.** Redis Cluster's asyncio client has no pub/sub, and
  a message could be lost anyway, so no process is told; instead no waiter sleeps longer than
  ``repoll`` times the number of this process's waiters of that kind (randomised). Each process then
  asks the bucket about once per ``repoll`` while it has waiters, whatever their number, and finds
  tokens another process handed back within about that long.

Only the waiting changes: the bucket, its capacity and what it charges stay as they are, so
nothing here can let more through than the limit.
"""

from __future__ import annotations

import asyncio
from collections import deque
from contextlib import suppress


class Doorbell:
    """The waiters of one kind (``request`` or ``tokens``) of one limiter in this process.

    ``rings`` counts the rings: a waiter reads it before it asks the bucket and passes it to
    :meth:`sleep`, which returns at once when a ring came meanwhile (a hand-back while its question
    was on the way to Redis is never slept through).
    """

    def __init__(self) -> None:
        self.rings = 0
        self._sleepers: deque[asyncio.Future[None]] = deque()

    @property
    def sleeping(self) -> int:
        """Waiters asleep now."""
        return len(self._sleepers)

    def ring(self) -> None:
        """Wake the waiter that has slept longest (none asleep: the next to sleep does not)."""
        self.rings += 1
        while self._sleepers:
            sleeper = self._sleepers.popleft()
            if not sleeper.done():
                sleeper.set_result(None)
                return

    async def sleep(self, seconds: float, since: int) -> None:
        """Sleep ``seconds``, or until rung; not at all when rung since ``since`` (a :attr:`rings`)."""
        if self.rings != since or seconds <= 0:
            return
        sleeper: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append(sleeper)
        try:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sleeper, seconds)
        finally:
            with suppress(ValueError):
                self._sleepers.remove(sleeper)
