"""Quarantine: a trajectory that was in a scorer when its worker stopped is scored alone, so blame is exact.

User code that runs inside the worker (a custom manager's ``run_single``, an ``async``
reward function, native code under either) can end the whole process: ``os._exit``, a
segfault, an out-of-memory kill. Nothing in the process survives to say which trajectory
did it, and every trajectory in flight at that moment is redelivered. A worker also stops
answering for reasons of its own: it is SIGKILLed, its machine goes away, or it is paused
(SIGSTOP, a VM migration) past its leases and comes back to find them taken. Each of these
looks the same from outside; what tells them apart is whether a trajectory keeps being in a
scorer when its worker stops.

So each lease counts an attempt (``attempts`` in the trajectory hash, counted by the
``store``/``claim`` scripts that take the lease; a graceful hand-back takes it back). A lease
carries the process life that took it, so a worker SIGKILLed and started again under the same
name counts a new attempt for what it held, as another worker reclaiming it would. A
trajectory leased with ``attempts > 1`` had an earlier attempt that never finished:

* **Reclaimed, not suspected** (no earlier start of a reclaimed attempt in a scorer): it is
  scored **beside the others**, at the worker's normal concurrency, and the worker counts the
  start (``shared`` in the hash, one round trip on this path only) as it enters the scorer.
  A worker's death or pause costs its trajectories nothing but the redelivery: the 20 judge
  calls of a killed worker are sent again side by side, not one after another. A trajectory
  that was merely waiting (for a slot, a retry, its turn) when the worker stopped is never
  counted.
* **Suspected** (a ``shared`` start never followed by an answer: the worker stopped again
  while this trajectory was in its scorer): it is scored in a **cohort**, by bisection. A
  cohort is a group of suspects scored together while nothing else scores: it forms when the
  scorer is idle and nothing joins it once it started. Its size is recorded in each member's
  hash (``width``; the start counted as ``cohort``). A suspect whose last cohort never ended
  (the worker died again) joins only a cohort of at most half that size; one never in a cohort
  joins any (up to the worker's slots). So the suspects of a death score side by side, and a
  trajectory that kills every worker is isolated in log2(group) more deaths while the halves
  without it finish. A cohort of one is a start **alone**, counted ``solo``: a ``solo`` start
  never followed by a commit means the worker died while this trajectory, and nothing else,
  was scoring: it took the process down. A trajectory with such a death is only ever scored
  alone again. After ``max_crashes`` such deaths it gets an error result naming them; every
  other trajectory is scored normally, on redelivery or by another worker.

A trajectory that kills every worker that scores it therefore costs, beyond ``max_crashes``,
one death for the batch it was first in (which blames nobody) and one per halving of the
cohort it is in; the innocent ones beside it finish in the halves without it. Worker deaths
that have nothing to do with a trajectory (two SIGKILLs in a row) cost its cohort one more
redelivery, side by side. A start taken back is not counted against a trajectory: an attempt
that rests before a retry, is handed back at shutdown, or whose commit failed (Redis refused
it) crashed nothing.

Quarantined trajectories wait in order of their earlier solo deaths, fewest first: the
innocent ones that were in flight beside a culprit (none) go before a suspect (one or more),
so they finish within a couple of redeliveries whatever the order they came in.

:class:`ScoringGate` is the in-process half: ordinary and reclaimed trajectories score side by
side (``shared``); a cohort of quarantined ones waits for them to finish and keeps new ones
from starting until its last member is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from rewardq.queue.attempts import AttemptNotes

logger = logging.getLogger("rewardq.worker")


#: The cohort limit of a suspect never scored in a cohort: any size (the worker's slots bound it).
ANY_SIZE = 1 << 30
#: The cohort limit of a trajectory that must score alone.
ALONE = 1
#: A quarantined trajectory's rank at the gate: solo deaths * COHORT_RANK + cohort deaths.
COHORT_RANK = 1000


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    limit: int = field(default=ALONE, compare=False)
    wake: asyncio.Future[Any] | None = field(default=None, compare=False)
    #: the size of the cohort it was admitted to (0 while it waits)
    size: int = field(default=0, compare=False)


def cohort_limit(solo: int, width: int | None) -> int:
    """The largest cohort a suspect may join: 1 after a death while it was scored alone (``solo``),
    half the cohort whose scoring never ended (``width``), any size if it was never in one."""
    if solo > 0:
        return 1
    return ANY_SIZE if width is None else max(1, width // 2)


class ScoringGate:
    """Shared scoring for ordinary trajectories, exclusive cohorts for quarantined ones.

    A waiting quarantined trajectory has priority: no new ordinary scoring starts while one
    waits (else a busy worker would never give it its turn). When the scorer is idle, the
    waiting quarantined trajectories form a cohort: the lowest ``priority`` (fewest earlier
    deaths) first, then the earliest arrival, then each next one while the cohort stays within
    every member's ``limit``. Nothing joins a cohort once it started.
    Entering ``shared`` costs no await while no quarantine is pending.
    """

    def __init__(self) -> None:
        self.running = 0
        self.cohort = 0  # members of the running cohort still scoring
        self.arriving = 0  # quarantined trajectories on their way in (see :meth:`arriving_one`)
        self._queue: list[_Waiter] = []  # heap of quarantined trajectories waiting
        self._shared_waiters: list[asyncio.Future[Any]] = []
        self._seq = itertools.count()

    async def enter_shared(self) -> None:
        while self.cohort or self._queue:
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

    async def enter_alone(self, priority: int = 0, limit: int = ALONE) -> int:
        """Wait for a cohort of at most ``limit`` quarantined trajectories to start with this one in
        it; returns its size. The caller must :meth:`leave_alone` afterwards."""
        return await self.wait_turn(self.join(priority, limit))

    def join(self, priority: int = 0, limit: int = ALONE) -> _Waiter:
        """Queue a quarantined trajectory (then :meth:`wait_turn`)."""
        me = _Waiter(priority, next(self._seq), limit=max(1, limit))
        heapq.heappush(self._queue, me)
        return me

    async def wait_turn(self, me: _Waiter) -> int:
        """Wait until ``me``'s cohort starts; returns its size."""
        try:
            await asyncio.sleep(0)  # let the others of the same batch queue up before a cohort forms
            self._wake()
            while not me.size:
                me.wake = asyncio.get_running_loop().create_future()
                await me.wake
        except BaseException:
            if me.size:  # admitted, then cancelled before its turn began
                self.leave_alone()
            else:
                self._queue.remove(me)
                heapq.heapify(self._queue)
                self._wake()
            raise
        return me.size

    @contextlib.contextmanager
    def arriving_one(self) -> Iterator[None]:
        """Hold cohorts back while a quarantined trajectory reads what it needs to enter
        (a round trip): the suspects of one batch arrive together, not one cohort each."""
        self.arriving += 1
        try:
            yield
        finally:
            self.arriving -= 1
            asyncio.get_running_loop().call_soon(self._wake)  # after the rest of its batch has queued

    def leave_alone(self) -> None:
        self.cohort -= 1
        self._wake()

    def _form_cohort(self) -> None:
        """Admit the next cohort from the waiting quarantined trajectories (the scorer is idle)."""
        order = sorted(self._queue)
        members, limit = [order[0]], order[0].limit
        for w in order[1:]:
            if len(members) + 1 <= min(limit, w.limit):
                members.append(w)
                limit = min(limit, w.limit)
        chosen = {id(m) for m in members}
        self._queue = [w for w in self._queue if id(w) not in chosen]
        heapq.heapify(self._queue)
        self.cohort = len(members)
        for m in members:
            m.size = len(members)
            if m.wake is not None and not m.wake.done():
                m.wake.set_result(None)

    def _wake(self) -> None:
        if self.cohort:
            return
        if self._queue:
            if not self.running and not self.arriving:
                self._form_cohort()
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


def suspected(solo: int, shared: int) -> bool:
    """Whether a reclaimed trajectory is scored alone: an earlier start of a reclaimed attempt of
    it in a scorer, alone (``solo``) or beside others (``shared``), never ended in an answer."""
    return solo > 0 or shared > 0


@dataclass
class Turn:
    """What a trajectory's turn at the gate was: ``crashes``, the deaths of the worker process while
    it was scored alone before (0 unless alone); ``counted``, the start it counted in Redis
    (``"solo"``, ``"cohort"``, ``"shared"``, or None on a first attempt), to take back when it
    crashed nothing."""

    crashes: int = 0
    counted: str | None = None
    attempt: int = 0  #: the attempt the start was counted for (``lua/count.lua``: counted once)


class Quarantine:
    """The worker's half of quarantine: its :class:`ScoringGate` and the start counts in Redis.

    Args:
        notes: the trajectories' notes on their attempts in Redis (the start counts).
    """

    def __init__(self, notes: AttemptNotes) -> None:
        self.notes = notes
        self.gate = ScoringGate()

    @contextlib.asynccontextmanager
    async def turn(self, shard: int, tid: str, attempts: int, solo: int = 0, shared: int = 0) -> AsyncIterator[Turn]:
        """Hold the gate while one trajectory is scored: shared on its first attempt and on a
        reclaimed one that is not :func:`suspected` (its start counted, ``shared``), in a cohort
        otherwise (its start counted, ``solo`` when alone, else ``cohort``). ``solo`` and
        ``shared``: its earlier starts, as :meth:`StreamBroker.store` read them.

        Yields the :class:`Turn`. A turn that ends cancelled (handed back at shutdown) takes its
        start back.
        """
        turn = Turn(attempt=attempts)
        alone = attempts > 1 and suspected(solo, shared)
        if alone:
            turn.crashes, turn.counted = await self.enter_alone(shard, tid, attempts, solo, shared)
        else:
            await self.gate.enter_shared()
            if attempts > 1:
                try:
                    await self.notes.start_shared(shard, tid, attempt=attempts)
                except BaseException:
                    self.gate.leave_shared()
                    await self._uncount(shard, tid, Turn(counted="shared", attempt=attempts))
                    raise
                turn.counted = "shared"
        try:
            yield turn
        except asyncio.CancelledError:
            await self.take_back(shard, tid, turn)
            raise
        finally:
            if alone:
                self.gate.leave_alone()
            else:
                self.gate.leave_shared()

    async def enter_alone(self, shard: int, tid: str, attempts: int, earlier: int, shared: int = 0) -> tuple[int, str]:
        """Wait until this quarantined trajectory may score in a cohort (alone, or beside other
        suspects: see the module doc), and count the start.

        ``earlier``: its earlier solo starts, ``shared`` its earlier starts beside others, as
        :meth:`StreamBroker.store` read them. Returns how many earlier starts of scoring it
        alone never finished (each one is a death of the worker process while this trajectory,
        and nothing else, was scored), and the start counted (``solo`` or ``cohort``). The caller
        must :meth:`ScoringGate.leave_alone` afterwards.
        """
        with self.gate.arriving_one():
            width, cohorts = await self.notes.cohort_state(shard, tid)
            limit = cohort_limit(earlier, width)
            # fewest solo deaths first, then fewest cohorts that died: the suspects that waited
            # while a cohort with a culprit in it died go before that cohort's members
            waiter = self.gate.join(priority=earlier * COHORT_RANK + min(cohorts, COHORT_RANK - 1), limit=limit)
        logger.warning(
            "trajectory %s: %d earlier attempt(s) never finished, %d of them while it was in a scorer "
            "(%d beside others, %d alone); scoring it %s",
            tid,
            attempts - 1,
            shared + earlier,
            shared,
            earlier,
            "alone"
            if limit == 1
            else f"in a cohort of suspects ({'any size' if limit == ANY_SIZE else f'at most {limit}'})",
        )
        size = await self.gate.wait_turn(waiter)
        field = "solo" if size == 1 else "cohort"
        try:
            if size == 1:
                return await self.notes.start_solo(shard, tid, attempt=attempts) - 1, field
            await self.notes.start_cohort(shard, tid, size, attempt=attempts)
            return 0, field
        except BaseException:
            self.gate.leave_alone()
            await self._uncount(shard, tid, Turn(counted=field, attempt=attempts))
            raise

    async def _uncount(self, shard: int, tid: str, turn: Turn) -> None:
        """A start whose count failed may have been counted all the same: its reply was
        lost after the script ran, or a stopping worker cancelled the wait for it. It crashed
        nothing: take it back (a no-op when it was not counted: ``lua/count.lua``), shielded so that
        a cancellation cannot cut the take-back short (it waits at most 2 s)."""
        await asyncio.shield(self.take_back(shard, tid, turn))

    async def take_back(self, shard: int, tid: str, turn: Turn) -> None:
        """The start ``turn`` counted crashed nothing (handed back at shutdown, resting before a
        retry, a commit Redis refused): take it back, once."""
        counted, turn.counted = turn.counted, None
        if counted is None:
            return
        if counted == "cohort":
            start = self.notes.start_cohort(shard, tid, by=-1, attempt=turn.attempt)
        else:
            count = self.notes.start_solo if counted == "solo" else self.notes.start_shared
            start = count(shard, tid, by=-1, attempt=turn.attempt)
        try:
            await asyncio.wait_for(start, 2.0)
        except Exception as exc:  # noqa: BLE001 - best effort; at worst it counts as one stop in a scorer
            logger.warning("could not take back the %s start of %s (%s)", counted, tid, exc)
