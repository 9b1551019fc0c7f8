"""What a trajectory's hash records about its attempts: transient-failure retries, attempts that
ended unanswered, and the starts of scoring that crash attribution counts.

:class:`~rewardq.queue.broker.StreamBroker` holds one :class:`AttemptNotes` (``broker.attempts``),
which :mod:`rewardq.consumers.retries` and :mod:`rewardq.consumers.quarantine` are given, and the
intake's delivery count, the dead letters' reasons and the scoring round read through the broker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewardq.queue.entries import Entry
from rewardq.queue.keys import Keyspace, parse_key, trajectory_id
from rewardq.queue.results import as_text
from rewardq.queue.script_runner import ScriptRunner
from rewardq.queue.text import reason_text

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis


@dataclass
class AttemptNotes:
    """Notes on trajectories' attempts, written by the consumer ``worker`` in its process ``life``."""

    r: AsyncRedis
    ks: Keyspace
    scripts: ScriptRunner
    worker: str
    cluster: bool
    life: str

    # -- transient failures retried in place ------------------------------------------------
    async def retry_since(self, shard: int, tid: str, now: float) -> float:
        """When ``tid`` first failed for a transient reason (``retry_since`` in its hash: ``now`` if
        this is the first time), so its ``retry_for`` window holds across the workers that score it."""
        key = self.ks.traj(shard, tid)
        pipe = self.r.pipeline(transaction=not self.cluster)
        pipe.hsetnx(key, "retry_since", f"{now:.6f}")
        pipe.hget(key, "retry_since")
        _, since = await pipe.execute()
        return float(since) if since else now

    async def note_retry(self, shard: int, tid: str, why: str, at: float) -> None:
        """Record that ``tid`` waits to be scored again at ``at`` (a wall time) because ``why``:
        ``retries`` counted, ``retry_reason`` and ``retry_at`` (for ``rewardq inspect``)."""
        key = self.ks.traj(shard, tid)
        pipe = self.r.pipeline(transaction=not self.cluster)
        pipe.hincrby(key, "retries", 1)
        pipe.hset(key, mapping={"retry_reason": reason_text(why, 500), "retry_at": f"{at:.6f}"})
        await pipe.execute()

    # -- attempts that never finished --------------------------------------------------------
    async def note_unfinished(self, shard: int, tid: str, why: str) -> None:
        """Record that this worker's attempt at ``tid`` ended without an answer, and why (a commit
        that failed, say), so a later dead letter tells it apart from a worker that died; and drop
        this worker's lease, so the next attempt starts at once (``lua/unfinished.lua``)."""
        args = [self.worker, reason_text(why, 500), self.life]
        await self.scripts.run("unfinished", [self.ks.traj(shard, tid)], args)

    async def attempt_history(self, shard: int, tid: str) -> dict[str, object]:
        """``attempts`` (leases taken, hand-backs not counted), ``unfinished`` (attempts that ended
        without an answer and said so), ``last_failure``, and ``handbacks`` (attempts handed back by
        workers that stopped) of a trajectory."""
        attempts, unfinished, last, handbacks = await self.r.hmget(  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
            self.ks.traj(shard, tid), ["attempts", "unfinished", "last_failure", "handbacks"]
        )
        return {
            "attempts": int(attempts or 0),
            "unfinished": int(unfinished or 0),
            "last_failure": as_text(last) if last else "",
            "handbacks": int(handbacks or 0),
        }

    # -- crash attribution -----------------------------------------------------------------
    # Each start is counted for one ``attempt`` (the trajectory's attempt number, from the lease):
    # counting it again, or taking it back again, changes nothing (``lua/count.lua``), so a count
    # the retry policy sends again after a lost reply is counted once. ``attempt`` 0 counts
    # unconditionally.
    async def start_solo(self, shard: int, tid: str, by: int = 1, *, attempt: int = 0) -> int:
        """Count a start of scoring this trajectory alone; returns the count, this one included.

        A start that was never followed by a commit means the worker died while this
        trajectory, and nothing else, was being scored: it took the process down. ``by=-1``
        takes a start back (it was handed back at shutdown, not crashed).
        """
        return await self._count_start(shard, tid, "solo", by, attempt=attempt)

    async def start_shared(self, shard: int, tid: str, by: int = 1, *, attempt: int = 0) -> int:
        """Count a start of scoring a reclaimed attempt of this trajectory beside others; returns
        the count, this one included.

        A start that was never followed by a commit means the worker stopped (died, or paused
        past its lease) while this trajectory was in a scorer: it may have taken the process
        down, and is scored alone from then on. ``by=-1`` takes a start back (it was handed
        back, or rests before a retry: it crashed nothing).
        """
        return await self._count_start(shard, tid, "shared", by, attempt=attempt)

    async def start_cohort(self, shard: int, tid: str, width: int = 0, by: int = 1, *, attempt: int = 0) -> int:
        """Count a start of scoring this suspect in a cohort of ``width`` suspects (recorded as its
        ``width``: see :mod:`rewardq.consumers.quarantine`); returns the count, this one included.

        A start that was never followed by a commit means the worker stopped while this cohort
        was scoring: the next cohort this trajectory joins is at most half as large. ``by=-1``
        takes a start back (``width`` stays: it only ever makes a later cohort smaller).
        """
        return await self._count_start(shard, tid, "cohort", by, width, attempt=attempt)

    async def cohort_state(self, shard: int, tid: str) -> tuple[int | None, int]:
        """The size of the last cohort this trajectory started in (None: never in one), and its
        starts in cohorts."""
        width, starts = await self.r.hmget(self.ks.traj(shard, tid), ["width", "cohort"])  # type: ignore[misc]  # see rewardq.queue.clients
        return (int(width) if width else None), int(starts or 0)

    async def cohort_starts(self, entries: Sequence[Entry]) -> list[int]:
        """Per entry, its trajectory's starts in a cohort of suspects (``cohort``; 0 for an entry
        that names no trajectory): one pipelined round trip."""
        named = [parse_key(e.key) for e in entries]
        pipe = self.r.pipeline(transaction=False)
        for n in named:
            if n is not None:
                pipe.hget(self.ks.traj_key(trajectory_id(n[0], n[1])), "cohort")
        got = iter(await pipe.execute())
        return [0 if n is None else int(next(got) or 0) for n in named]

    async def _count_start(self, shard: int, tid: str, field: str, by: int, width: int = 0, *, attempt: int = 0) -> int:
        token = f"{self.worker}/{attempt}" if attempt > 0 else ""
        args: list[Any] = [field, by, token, width if width > 0 else ""]
        return int(await self.scripts.run("count", [self.ks.traj(shard, tid)], args))  # past maxmemory too
