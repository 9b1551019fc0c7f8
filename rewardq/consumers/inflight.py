"""The trajectories a worker holds, bounded by ``concurrency`` and ``read_ahead``.

A trajectory is held from the moment this worker takes its lease until it is committed or failed
(or, at shutdown, handed back), and the heartbeat renews the lease of every held trajectory
(:meth:`InFlightTable.held`). :class:`InFlightTable` is the worker's admission control: ``slots``
lets at most ``concurrency`` of them score at once, and the worker holds at most ``concurrency``
plus ``ahead`` (``read_ahead`` times ``concurrency``, rounded up) of them: the ones beyond its slots
wait for one, already leased, so a slot that frees starts the next at once instead of after a read.
``capacity`` is set while at least ``refill`` (half of ``ahead``, at least one) more may be held, so
a busy worker reads in batches of that many rather than one entry per freed slot; the readers wait
for it, and each read asks for no more entries than :meth:`InFlightTable.room` (an entry completes
at most one trajectory). So a worker started on a backlog takes a small share of it, not the whole
backlog its ``batch_size`` would let one read return, and the other workers get the rest.

**Reclaim.** A dead worker's entries are taken over by
:meth:`~rewardq.consumers.worker.Worker.maintain` into :meth:`InFlightTable.reclaim_room`: one
worker's worth (``concurrency`` + ``ahead``) beyond what the readers fill. The readers keep a busy
worker full to its own bound, so a reclaim that needed ``capacity`` would wait until the fleet ran
out of work; with this room a busy survivor takes a dead worker's trajectories over at its next
maintenance pass, and its readers read nothing new until it holds fewer than its own bound again, so
the reclaimed trajectories are scored before new ones.

A trajectory waiting on a retry (:mod:`rewardq.consumers.retries`) is held, its lease renewed,
but *rests*: it holds no slot and does not count against these bounds, so other trajectories
keep flowing while a judge is down. At most ``max_resting`` rest at once; while that many do,
``capacity`` stays clear, the worker reads no more and reclaims nothing.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

#: Trajectories one worker holds waiting on a retry, per ``concurrency`` slot: they hold no scoring
#: slot (other trajectories keep flowing), but the worker reads no more while this many wait.
RETRY_WAITING_PER_SLOT = 4


@dataclass
class InFlight:
    """One held trajectory and the task that scores it."""

    shard: int
    tid: str
    started: float
    task: asyncio.Task[Any] | None = None
    cancelled: bool = False  # its producer cancelled it: its task was cancelled to stop scoring it

    def cancel(self) -> None:
        """Stop scoring: the producer cancelled the trajectory (``RewardClient.cancel``)."""
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()


class InFlightTable:
    """The held trajectories by id (:attr:`by_tid`), with ``capacity`` and ``slots`` (see the module doc)."""

    def __init__(self, concurrency: int, max_resting: int | None = None, *, read_ahead: float) -> None:
        self.concurrency = concurrency
        self.ahead = math.ceil(concurrency * read_ahead)  # held beyond the slots, waiting for one
        self.bound = concurrency + self.ahead  # what the readers fill the worker to
        self.refill = max(1, math.ceil(self.ahead / 2))  # the fewest a busy worker reads at once
        self.max_resting = concurrency * RETRY_WAITING_PER_SLOT if max_resting is None else max_resting
        self.by_tid: dict[str, InFlight] = {}
        self.resting: set[str] = set()  # held, waiting on a retry: no slot, not counted in `concurrency`
        self.capacity = asyncio.Event()  # set while fewer than `bound` trajectories are held
        self.capacity.set()
        self.slots = asyncio.Semaphore(concurrency)  # at most `concurrency` scored at once
        self.stopped = False

    def hold(self, shard: int, tid: str) -> InFlight | None:
        """Hold ``tid``; None when it is held already (our own redelivery while we score it:
        the commit will ack it)."""
        if tid in self.by_tid:
            return None
        flight = self.by_tid[tid] = InFlight(shard, tid, time.time())
        self._admit()
        return flight

    def finished(self, tid: str, *, handed_back: bool = False) -> None:
        """``tid`` is no longer scored; a trajectory handed back stays held until it is released."""
        if not handed_back:
            self.by_tid.pop(tid, None)
        self.resting.discard(tid)
        self._admit()

    def rest(self, tid: str) -> None:
        """``tid`` waits on a retry: it no longer counts against ``concurrency``."""
        if tid in self.by_tid:
            self.resting.add(tid)
            self._admit()

    def wake(self, tid: str) -> None:
        """``tid`` is due to be scored again: it counts again."""
        self.resting.discard(tid)
        self._admit()

    def stop_admitting(self) -> None:
        """The worker stops: ``capacity`` stays set from now on, so nothing waits on it any more."""
        self.stopped = True
        self.capacity.set()

    def _counted(self) -> int:
        """The held trajectories that count against the bounds (those not resting)."""
        return len(self.by_tid) - len(self.resting)

    def room(self) -> int:
        """How many more trajectories the readers may take now (0 while ``max_resting`` rest)."""
        if len(self.resting) >= self.max_resting:
            return 0
        return max(0, self.bound - self._counted())

    def reclaim_room(self) -> int:
        """How many of a dead worker's trajectories a reclaim may take now: one worker's worth
        (``bound``) beyond the readers' bound (module doc, "Reclaim")."""
        if self.stopped or len(self.resting) >= self.max_resting:
            return 0
        return max(0, 2 * self.bound - self._counted())

    def _admit(self) -> None:
        """Set ``capacity`` while :meth:`room` is at least ``refill`` (or once the worker stops); clear it otherwise."""
        if self.stopped or self.room() >= self.refill:
            self.capacity.set()
        else:
            self.capacity.clear()

    def held(self) -> dict[int, list[str]]:
        """The held trajectories as ``{shard: [tid, ...]}`` (what the broker renews and releases)."""
        held: dict[int, list[str]] = {}
        for f in self.by_tid.values():
            held.setdefault(f.shard, []).append(f.tid)
        return held

    async def settle(self, grace: float) -> None:
        """Let the scoring tasks finish within ``grace`` seconds; cancel the ones still running."""
        pending = [f.task for f in self.by_tid.values() if f.task is not None]
        if pending:
            _, not_done = await asyncio.wait(pending, timeout=grace)
            for t in not_done:
                t.cancel()
            await asyncio.gather(*not_done, return_exceptions=True)
