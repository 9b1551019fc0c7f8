"""Transient failures retried in place: the trajectory waits, keeps its lease, and is scored again.

A trajectory whose scoring failed for a ``transient`` reason
(:func:`~rewardq.queue.states.failure_kind_of`: a judge or reward model answering 429 or 5xx or
not answering, SandboxFusion down, a lost connection, a :class:`~rewardq.errors.TransientError`
raised by a reward function) is not failed. The worker

1. gives its scoring slot back, so other trajectories keep flowing, and keeps holding it: its
   lease is renewed by every heartbeat, as for any trajectory in flight;
2. waits: the server's ``Retry-After`` plus up to :data:`RETRY_JITTER` of it
   again at random when it sent one (never sooner), else the one backoff
   (:func:`rewardq.backoff.compute_backoff`: ``RETRY_BACKOFF_BASE`` doubling up to
   ``RETRY_BACKOFF_CAP``, half of each pause drawn at random), so trajectories that failed
   together do not come back together;
3. scores it again, taking a slot and the fleet's rate limits like any other trajectory;

until ``retry_for`` seconds have passed since its first transient failure (``retry_since`` in its
hash, so the window holds across the workers and redeliveries that score it). Then, or when the
server asks to wait past the window, it becomes an error result of kind ``transient`` whose reason
says how often it was tried. A worker that stops while a trajectory waits hands it back at once.

This is the one retry of remote scoring: the judge, reward-model and SandboxFusion clients never
sleep and send again themselves; they raise the failure with its kind and ``Retry-After``, and
this layer decides. :class:`Retries` is a collaborator of :class:`~rewardq.consumers.worker.Worker`;
what waits, and why, is in the worker's heartbeat (``rewardq status``, ``rewardq top``), its
metrics, and the trajectory's hash (``rewardq inspect``).

**Redis full.** A write of results that Redis refuses because it is past ``maxmemory`` (the
``commit``, ``fail`` and ``expire`` scripts are refused whole, before they run:
:mod:`rewardq.queue.scripts`) is waited out by :class:`RoomWaits`, the one place that decides
it: the same write is sent again after the backoff (:data:`ROOM_BACKOFF_BASE`
doubling up to :data:`ROOM_BACKOFF_CAP`, half of each pause at random), for as
long as it takes, or, for a write of results, for ``room_wait`` seconds (then :class:`NoRoom`:
the worker gives its keys an error result of kind ``memory`` naming the results' size and Redis's
cap, itself waited out as long as it takes: it is small, and a key is never lost). Its trajectory
keeps its lease (renewals are allowed past ``maxmemory``) and its slot, so a full Redis slows the
worker down instead of losing a result or spending a delivery; a worker that stops meanwhile hands
the trajectory back. The first refusal of an episode is logged once (a warning naming what to
do), its end once (how long it lasted, how many refusals), and
every refusal is counted (``redis_full`` in the heartbeat, ``rewardq_redis_full_waits_total``);
a write given up is counted in ``no_room`` (heartbeat) and its keys' error results in
``rewardq_failures_total{kind="memory"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rewardq.backoff import compute_backoff
from rewardq.consumers.metrics import Metrics
from rewardq.queue.attempts import AttemptNotes
from rewardq.queue.connection import is_out_of_memory
from rewardq.queue.states import NO_DATA_SOURCE, FailureKind, failure_kind_of
from rewardq.queue.text import reason_text
from rewardq.reward.http import retry_after_of

#: The first pause before a transient failure is scored again, and the longest (before jitter): the
#: pause doubles from the first to the longest unless the server said how long (``Retry-After``).
RETRY_BACKOFF_BASE = 1.0
RETRY_BACKOFF_CAP = 30.0
#: Seconds before a write Redis refused for want of memory (past ``maxmemory``) is sent again:
#: the first pause, doubling up to the cap (rewardq.consumers.retries.RoomWaits). Short: room comes
#: back as soon as a trainer reads and deletes results or they expire.
ROOM_BACKOFF_BASE = 0.05
ROOM_BACKOFF_CAP = 2.0
#: Seconds after an episode of such refusals ends during which a new one is counted, not logged.
ROOM_LOG_QUIET = 60.0
#: Share of each pause drawn at random (the pause is ``step * (1 - RETRY_JITTER * r)``), and the
#: share of a ``Retry-After`` added at random past it, so trajectories that failed together do not
#: come back together.
RETRY_JITTER = 0.5


logger = logging.getLogger("rewardq.worker")

#: Characters of a failure's reason kept for the heartbeat and the trajectory's hash.
REASON_CHARS = 300
#: Trajectories waiting on a retry that a heartbeat lists (soonest first); the rest are counted.
LISTED = 20

T = TypeVar("T")


@dataclass
class RetryWait:
    """One trajectory waiting to be scored again.

    Attributes:
        retries: the retries scheduled for it by this worker, this one included.
        since: when it first failed for a transient reason (wall time; the fleet's record).
        until: when its window ends (``since + retry_for``).
        at: when it is scored again (wall time).
    """

    tid: str
    shard: int
    data_source: str
    reason: str
    retries: int
    since: float
    until: float
    at: float

    def view(self, now: float) -> dict[str, object]:
        """What a heartbeat says of it."""
        return {
            "tid": self.tid,
            "data_source": self.data_source,
            "reason": self.reason,
            "retries": self.retries,
            "next_in_s": round(max(0.0, self.at - now), 1),
            "left_s": round(max(0.0, self.until - now), 1),
        }


class Retries:
    """Which failed trajectories wait to be scored again, for how long, and the waiting (module doc).

    Args:
        notes: the trajectories' notes on their attempts in Redis (the window's start, the notes for ``inspect``).
        retry_for: seconds from a trajectory's first transient failure during which it is retried
            (0: never).
        stopping: set when the worker stops: every wait ends at once, to hand its trajectory back.
        metrics: the worker's metrics hooks (retries counted per data source).
        stats: the worker's counters (``retries``).
        base, cap, jitter: the backoff (see the module doc).
        rand: the source of randomness (tests pass a fixed one).
    """

    def __init__(
        self,
        notes: AttemptNotes,
        *,
        retry_for: float,
        stopping: asyncio.Event,
        metrics: Metrics,
        stats: dict[str, int],
        base: float = RETRY_BACKOFF_BASE,
        cap: float = RETRY_BACKOFF_CAP,
        jitter: float = RETRY_JITTER,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.notes = notes
        self.retry_for = retry_for
        self.stopping = stopping
        self.metrics = metrics
        self.stats = stats
        self.base, self.cap, self.jitter = base, cap, jitter
        self.rand = rand
        self.waiting: dict[str, RetryWait] = {}
        self._tried: dict[str, RetryWait] = {}  # the last wait of each trajectory retried and not finished
        self._verdicts: dict[str, str] = {}  # why a transient failure was not retried again

    def pause(self, retries: int, retry_after: float | None) -> float:
        """Seconds before retry number ``retries``: the server's ``Retry-After`` and up to ``jitter``
        of it again at random, else the backoff (module doc)."""
        if retry_after is not None:
            return retry_after * (1 + self.jitter * self.rand())
        return compute_backoff(retries, base=self.base, cap=self.cap, jitter=self.jitter, rand=self.rand)

    async def plan(self, shard: int, tid: str, data_source: str, exc: BaseException) -> RetryWait | None:
        """The wait before ``tid`` is scored again after ``exc``; None when it must fail now: the
        failure is not ``transient``, its window has run out, or the server asked to wait past it
        (:meth:`gave_up` then says which, for its error)."""
        if failure_kind_of(exc) is not FailureKind.TRANSIENT:
            return None
        if self.retry_for <= 0:
            self._verdicts[tid] = " (not retried: retry_for=0)"
            return None
        now = time.time()
        last = self._tried.get(tid)
        try:
            since = await self.notes.retry_since(shard, tid, now)
        except Exception as exc2:  # noqa: BLE001 - Redis away: this worker's own record of the window
            logger.debug("could not read the retry window of %s: %s", tid, exc2)
            since = last.since if last is not None else now
        retries = (last.retries if last is not None else 0) + 1
        retry_after = retry_after_of(exc)
        pause, until = self.pause(retries, retry_after), since + self.retry_for
        if now + (retry_after or 0.0) >= until:  # the window is spent, or the server is back too late
            tried = f"tried {retries} time(s) over {now - since:.1f}s"
            later = (
                f"the server asked to retry after {retry_after:g}s, later than the {until - now:.1f}s left; "
                if retry_after is not None and now < until
                else ""
            )
            self._verdicts[tid] = f" ({tried}; {later}retry_for={self.retry_for:g}s ran out)"
            return None
        pause = min(pause, until - now)  # a last try as the window closes, never before Retry-After
        wait = RetryWait(tid, shard, data_source, reason_text(exc, REASON_CHARS), retries, since, until, now + pause)
        self._tried[tid] = wait
        self.stats["retries"] = self.stats.get("retries", 0) + 1
        self.metrics.retried(data_source or NO_DATA_SOURCE)
        try:
            await self.notes.note_retry(shard, tid, wait.reason, wait.at)
        except Exception as exc2:  # noqa: BLE001 - only `rewardq inspect` reads it
            logger.debug("could not record the retry of %s: %s", tid, exc2)
        logger.warning(
            "trajectory %s: transient failure (%s); scored again in %.1fs (retry %d, %.0fs left of retry_for=%gs)",
            tid,
            wait.reason,
            pause,
            retries,
            until - now,
            self.retry_for,
        )
        return wait

    async def wait(self, w: RetryWait) -> bool:
        """Sleep until ``w`` is due; False when the worker stops first (hand the trajectory back)."""
        self.waiting[w.tid] = w
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), max(0.0, w.at - time.time()))
            return not self.stopping.is_set()
        finally:
            self.waiting.pop(w.tid, None)

    def gave_up(self, tid: str) -> str:
        """Why :meth:`plan` let ``tid``'s transient failure become an error, for its reason (empty
        for a failure of another kind)."""
        return self._verdicts.pop(tid, "")

    def finished(self, tid: str) -> None:
        """``tid`` is no longer held by this worker: forget its retries."""
        self._tried.pop(tid, None)
        self._verdicts.pop(tid, None)

    def snapshot(self, now: float) -> dict[str, Any]:
        """What the heartbeat says: how many wait, and the :data:`LISTED` soonest, with why."""
        soonest = sorted(self.waiting.values(), key=lambda w: w.at)[:LISTED]
        return {"n": len(self.waiting), "waiting": [w.view(now) for w in soonest]}


class NoRoom(Exception):
    """A write Redis refused past ``maxmemory`` for longer than its caller would wait.

    Args:
        what: the write, as :meth:`RoomWaits.retrying` was told (``the commit of u_s``).
        waited: seconds since its first refusal.
        refusals: how often it was refused.
        last: Redis's last refusal.
    """

    def __init__(self, what: str, waited: float, refusals: int, last: BaseException) -> None:
        super().__init__(
            f"Redis refused {what} {refusals} times over {waited:.0f}s past its maxmemory ({reason_text(last, 200)})"
        )
        self.what, self.waited, self.refusals = what, waited, refusals


class RoomWaits:
    """Writes Redis refused for want of memory, sent again once there may be room (module doc,
    "Redis full").

    Args:
        metrics: the worker's metrics hooks (``redis_full``).
        stats: the worker's counters (``redis_full``: refusals waited out).
        base, cap: the backoff between tries of one write.
        rand: the source of randomness (tests pass a fixed one).
    """

    def __init__(
        self,
        *,
        metrics: Metrics,
        stats: dict[str, int],
        base: float = ROOM_BACKOFF_BASE,
        cap: float = ROOM_BACKOFF_CAP,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.metrics = metrics
        self.stats = stats
        self.base, self.cap = base, cap
        self.rand = rand
        self.since: float | None = None  # when the current episode of refusals began (monotonic)
        self.refused = 0  # refusals in the current episode
        self._logged = False  # the current episode's start was logged
        self._quiet_until = 0.0  # episodes starting before this are counted, not logged

    async def retrying(self, what: str, call: Callable[[], Awaitable[T]], patience: float | None = None) -> T:
        """``await call()``, sent again after a pause each time Redis refuses it for want of memory;
        any other failure is raised. ``what`` names the write for the log (``the commit of u_s``);
        ``patience``: seconds after the first refusal past which :class:`NoRoom` is raised instead
        of another try (None: try for as long as it takes)."""
        tries, first = 0, 0.0
        while True:
            try:
                result = await call()
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                tries += 1
                now = time.monotonic()
                first = first or now
                if patience is not None and now - first >= patience:
                    self.stats["no_room"] = self.stats.get("no_room", 0) + 1
                    raise NoRoom(what, now - first, tries, exc) from exc
                await self.refusal(tries, what, exc)
                continue
            self.took()
            return result

    async def refusal(self, tries: int, what: str, exc: BaseException) -> None:
        """Count one refusal (the ``tries``-th of one write), log it if it opens an episode, pause."""
        self.stats["redis_full"] = self.stats.get("redis_full", 0) + 1
        self.metrics.redis_full()
        self.refused += 1
        if self.since is None:
            self.since = time.monotonic()
            self._logged = self.since >= self._quiet_until
        if self.refused == 1 and self._logged:
            logger.warning(
                "Redis is past its maxmemory and refused %s (%s); results wait in this worker and are "
                "written once there is room (nothing is lost; logged at most once a minute). "
                "Read and delete results faster, lower result_ttl, or raise Redis's maxmemory",
                what,
                reason_text(exc, 200),
            )
        await asyncio.sleep(compute_backoff(tries, base=self.base, cap=self.cap, jitter=0.5, rand=self.rand))

    def took(self) -> None:
        """A write went through: an episode of refusals, if one was on, is over (logged once)."""
        if self.since is not None:
            now = time.monotonic()
            if self._logged:
                logger.warning(
                    "Redis took writes again after %.1fs past its maxmemory (%d refusals waited out; "
                    "refusals in the next %.0fs are counted in redis_full, not logged)",
                    now - self.since,
                    self.refused,
                    ROOM_LOG_QUIET,
                )
                self._quiet_until = now + ROOM_LOG_QUIET
            self.since, self.refused = None, 0
