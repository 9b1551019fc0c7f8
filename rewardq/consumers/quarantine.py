"""Quarantine: a trajectory whose earlier attempt died is scored alone, so blame is exact.

User code that runs inside the worker (a custom manager's ``run_single``, an ``async``
reward function, native code under either) can end the whole process: ``os._exit``, a
segfault, an out-of-memory kill. Nothing in the process survives to say which trajectory
did it, and every trajectory in flight at that moment is redelivered.

So each lease counts an attempt (``attempts`` in the trajectory hash, counted by the
``store``/``claim`` scripts that take the lease; a graceful hand-back takes it back). A
trajectory leased with ``attempts > 1`` had an earlier attempt that never finished, and
the worker scores it **alone**: it waits until nothing else is scoring and nothing else
starts until it is done. Before it starts, the worker counts the start (``solo`` in the
hash, one extra round trip on this rare path). A start that is never followed by a commit
means the worker died while this trajectory, and nothing else, was scoring: it took the
process down. After ``max_crashes`` such deaths the trajectory gets an error result naming
them; every other trajectory is scored normally, on redelivery or by another worker.

Quarantined trajectories wait in order of their earlier solo deaths, fewest first: the
innocent ones that were merely in flight during a crash (none) go before a suspect (one or
more), so they finish within a couple of redeliveries whatever the order they came in.

:class:`ScoringGate` is the in-process half: ordinary trajectories score side by side
(``shared``); a quarantined one waits for them to finish and keeps new ones from starting
(``alone``) until it is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from rewardq.queue.broker import StreamBroker

logger = logging.getLogger("rewardq.worker")


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    wake: asyncio.Future[Any] | None = field(default=None, compare=False)


class ScoringGate:
    """Shared scoring for ordinary trajectories, exclusive for quarantined ones.

    A waiting quarantined trajectory has priority: no new ordinary scoring starts while one
    waits (else a busy worker would never give it its turn). Among quarantined trajectories
    the lowest ``priority`` (fewest earlier deaths) goes first, then the earliest arrival.
    Entering ``shared`` costs no await while no quarantine is pending.
    """

    def __init__(self) -> None:
        self.running = 0
        self.alone = False
        self._queue: list[_Waiter] = []  # heap of quarantined trajectories waiting
        self._shared_waiters: list[asyncio.Future[Any]] = []
        self._seq = itertools.count()

    async def enter_shared(self) -> None:
        while self.alone or self._queue:
            fut = asyncio.get_running_loop().create_future()
            self._shared_waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._shared_waiters:
                    self._shared_waiters.remove(fut)
        self.running += 1

    def leave_shared(self) -> None:
        self.running -= 1
        self._wake()

    async def enter_alone(self, priority: int = 0) -> None:
        me = _Waiter(priority, next(self._seq))
        heapq.heappush(self._queue, me)
        try:
            await asyncio.sleep(0)  # let the others of the same batch queue up before the first one starts
            while self.alone or self.running or self._queue[0] is not me:
                me.wake = asyncio.get_running_loop().create_future()
                await me.wake
        except BaseException:
            self._queue.remove(me)
            heapq.heapify(self._queue)
            self._wake()
            raise
        heapq.heappop(self._queue)
        self.alone = True

    def leave_alone(self) -> None:
        self.alone = False
        self._wake()

    def _wake(self) -> None:
        if self.alone:
            return
        if self._queue:
            head = self._queue[0]
            if not self.running and head.wake is not None and not head.wake.done():
                head.wake.set_result(None)
            return
        waiters, self._shared_waiters = self._shared_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


def crash_reason(crashes: int) -> str:
    """The error of a trajectory that took its worker process down ``crashes`` times."""
    return (
        f"the worker process scoring this trajectory died {crashes} time(s) while it was scored alone: "
        "its reward manager or reward function ended the process (os._exit, a segfault, an out-of-memory "
        "kill?); the other trajectories were scored normally"
    )


class Quarantine:
    """The worker's half of quarantine: its :class:`ScoringGate` and the solo counts in Redis.

    Args:
        broker: the worker's gateway to Redis (``start_solo``).
    """

    def __init__(self, broker: StreamBroker) -> None:
        self.broker = broker
        self.gate = ScoringGate()

    @contextlib.asynccontextmanager
    async def turn(self, shard: int, tid: str, attempts: int, earlier: int) -> AsyncIterator[int]:
        """Hold the gate while one trajectory is scored: shared on its first attempt, alone after
        an attempt that never finished (``attempts > 1``; ``earlier`` as for :meth:`enter_alone`).

        Yields the deaths of the worker process while it was scored alone before (0 when
        shared). A turn alone that ends cancelled (handed back at shutdown) takes its start back.
        """
        alone = attempts > 1
        crashes = 0
        if alone:
            crashes = await self.enter_alone(shard, tid, attempts, earlier)
        else:
            await self.gate.enter_shared()
        try:
            yield crashes
        except asyncio.CancelledError:
            if alone:
                await self.handed_back(shard, tid)
            raise
        finally:
            if alone:
                self.gate.leave_alone()
            else:
                self.gate.leave_shared()

    async def enter_alone(self, shard: int, tid: str, attempts: int, earlier: int) -> int:
        """Wait until this quarantined trajectory may score alone, and count the start.

        ``earlier``: its earlier solo starts, as :meth:`StreamBroker.store` read them.
        Returns how many earlier starts of scoring it alone never finished: each one is a
        death of the worker process while this trajectory, and nothing else, was scored.
        The caller must :meth:`ScoringGate.leave_alone` afterwards.
        """
        logger.warning(
            "trajectory %s: %d earlier attempt(s) never finished (%d while scored alone); scoring it alone",
            tid,
            attempts - 1,
            earlier,
        )
        await self.gate.enter_alone(priority=earlier)
        try:
            return await self.broker.start_solo(shard, tid) - 1
        except BaseException:
            self.gate.leave_alone()
            raise

    async def handed_back(self, shard: int, tid: str) -> None:
        """A solo attempt handed back at shutdown crashed nothing: take its count back."""
        try:
            await asyncio.wait_for(self.broker.start_solo(shard, tid, by=-1), 2.0)
        except Exception as exc:  # noqa: BLE001 - best effort; at worst it counts as one crash
            logger.warning("could not take back the solo attempt of %s (%s)", tid, exc)
