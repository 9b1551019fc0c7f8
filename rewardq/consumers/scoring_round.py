"""One trajectory's round from a scoring slot to its commit, the worker's ``score`` step.

:class:`~rewardq.consumers.worker.Worker` holds one :class:`ScoringRound` and runs :meth:`ScoringRound.run`
in its own task for every trajectory it must score. Each try holds a slot (``concurrency``) and the
trajectory's quarantine turn (:mod:`rewardq.consumers.quarantine`): assemble, check the batch's
bytes, score (:class:`~rewardq.consumers.scorer.TrajectoryScorer`), then **commit**: every key's
result written and the entries acknowledged in one atomic step (:class:`~rewardq.consumers.commits.CommitCoalescer`),
never an ack before the write. A transient failure rests without a slot until its retry is due
(:mod:`rewardq.consumers.retries`); any other failure gives every key an error result and a dead
letter (:class:`~rewardq.consumers.failures.FailureHandler`), ledger row first
(:mod:`rewardq.consumers.accounting`). The round ends by telling the in-flight table, the metrics
and the log what became of the trajectory.

A command Redis refuses for lack of permission is the worker's failure, not the trajectory's: the
round asks the worker (``refused``), which stops, and the trajectory is handed back.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager

from rewardq.consumers.assembly import assemble, trajectory_sample
from rewardq.consumers.batch import check_batch_bytes
from rewardq.consumers.failures import permission_refusal, refusal
from rewardq.consumers.log_summary import LogSummary
from rewardq.consumers.parts import WorkerParts
from rewardq.consumers.quarantine import Turn, crash_reason
from rewardq.consumers.retries import NoRoom, RetryWait
from rewardq.errors import RecordError
from rewardq.queue.codec import OutputRecord
from rewardq.queue.endings import Failed
from rewardq.queue.entries import StoreOutcome
from rewardq.queue.results import EncodedResults
from rewardq.queue.states import DEAD_LETTER_FAILURE, DeadLetterKind, FailureKind, failure_kind_of
from rewardq.reward.trace import ScoringTrace

logger = logging.getLogger("rewardq.worker")


class ScoringRound:
    """Scores and commits (or fails) the trajectories a worker holds, one :meth:`run` each.

    Args:
        parts: the worker's parts (:class:`~rewardq.consumers.parts.WorkerParts`).
        log_summary: the worker's summary line, told how each trajectory ended.
        refused: the worker's check for a command Redis refused it (True: the worker stops, and
            the trajectory is handed back rather than blamed).
    """

    def __init__(
        self, parts: WorkerParts, *, log_summary: LogSummary, refused: Callable[[BaseException], bool]
    ) -> None:
        self.parts = parts  # read through, so a new part reaches the round without a copy here
        self.log_summary = log_summary
        self._refused = refused

    async def run(self, o: StoreOutcome) -> None:
        """Score and commit (or fail) one trajectory, each try with a slot and its quarantine turn;
        after a transient failure, rest without a slot until its retry is due (:mod:`.retries`)."""
        shard, tid = o.entry.shard, o.record.tid
        t0 = time.perf_counter()
        outcome = "ok"
        data_source = str(o.record.sample.get("data_source", ""))
        scoring_s: float | None = None  # time spent holding a slot: its scoring time excludes the waits
        turn: Turn | None = None
        try:
            while True:
                # in flight (its lease renewed) while it waits for a slot and its turn
                async with self.parts.flights.slots, self._turn(o) as turn:
                    t_slot = time.perf_counter()
                    try:
                        tried = await self._try(o, turn.crashes, data_source)
                    finally:
                        scoring_s = (scoring_s or 0.0) + time.perf_counter() - t_slot
                if not isinstance(tried, RetryWait):
                    outcome = tried
                    break
                if not await self._rest(o, tried, turn):
                    outcome = "handed-back"
                    break
        except asyncio.CancelledError:  # the worker's own (the scorer turns any other into an error)
            flight = self.parts.flights.by_tid.get(tid)
            if flight is None or not flight.cancelled or self.parts.stopping.is_set():
                outcome = "handed-back"
                raise
            outcome = "cancelled"  # by its producer: the cancel script ended it; nothing to hand back
            self.parts.stats["cancelled"] += 1
            uncancel = getattr(asyncio.current_task(), "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()
        except Exception as exc:
            if self._refused(exc):  # the worker stops; the trajectory stays pending, for a worker with the rights
                outcome = "handed-back"
            else:
                outcome = "commit-failed"
                logger.exception("could not finish %s; its entry stays pending and will be reclaimed", tid)
                await self._note_unfinished(
                    shard, tid, f"its result could not be written ({type(exc).__name__}: {exc})"
                )
            if turn is not None:  # a refused commit crashed nothing
                await self.parts.quarantine.take_back(shard, tid, turn)
        finally:
            self._finished(tid, outcome, t0, data_source)
            if scoring_s is not None and outcome != "handed-back":
                self.parts.presence.finished(data_source, scoring_s)

    def _turn(self, o: StoreOutcome) -> AbstractAsyncContextManager[Turn]:
        """The quarantine turn of ``o``'s trajectory (alone once it was in a scorer of a reclaimed
        attempt when a worker stopped; see :mod:`rewardq.consumers.quarantine`)."""
        return self.parts.quarantine.turn(o.entry.shard, o.record.tid, o.attempts, o.solo, o.shared)

    async def _try(self, o: StoreOutcome, crashes: int, data_source: str) -> str | RetryWait:
        """One try at a trajectory, holding its slot and turn: its outcome, or the wait before the next try."""
        if o.attempts > 1 and crashes >= self.parts.cfg.max_crashes:
            await self._fail(o, o.records, DeadLetterKind.CRASHED, crash_reason(crashes), data_source=data_source)
            return DeadLetterKind.CRASHED
        return await self._score(o, o.entry.shard, o.record.tid, data_source)

    async def _rest(self, o: StoreOutcome, wait: RetryWait, turn: Turn) -> bool:
        """Wait for a retry, holding no slot (its lease renewed); False when the worker stops first:
        the trajectory is then handed back. A reclaimed trajectory's start in the scorer is taken
        back (it crashed nothing), to be counted again when it starts again."""
        await self.parts.quarantine.take_back(o.entry.shard, o.record.tid, turn)
        self.parts.flights.rest(o.record.tid)
        try:
            return await self.parts.retries.wait(wait)
        finally:
            self.parts.flights.wake(o.record.tid)

    async def _note_unfinished(self, shard: int, tid: str, why: str) -> None:
        """Best effort: record why this attempt ended unanswered, for the dead letter of a trajectory
        that runs out of deliveries (so it never blames a crash that did not happen)."""
        try:
            await self.parts.broker.attempts.note_unfinished(shard, tid, why)
        except Exception as exc:  # noqa: BLE001 - Redis is likely what failed; the delivery count still counts
            logger.debug("could not record the failed attempt of %s: %s", tid, exc)

    async def _score(self, o: StoreOutcome, shard: int, tid: str, data_source: str) -> str | RetryWait:
        """Assemble, score and commit one trajectory (or fail it); returns the outcome to log, or the
        wait before it is scored again after a transient failure (:mod:`rewardq.consumers.retries`)."""
        cfg = self.parts.cfg
        records: list[OutputRecord] | None = None
        try:
            records = o.records or assemble(
                tid,
                o.payloads,
                max_bytes=cfg.max_record_bytes,
                vocab_size=self.parts.vocab_size,
                known=o.record,
                max_outputs=cfg.max_outputs,
                max_image_bytes=cfg.max_image_bytes,
                tokenizer=self.parts.tokenizer_fingerprint,
            )
            check_batch_bytes(records, cfg.max_batch_bytes)  # before the batch is built
        except RecordError as exc:
            kind, why = refusal(exc, tid)
            await self._fail(o, records, kind, why, data_source=data_source)
            return kind
        o.records = records  # a retry scores the same records again
        prov = self.parts.accounting.provenance_of(trajectory_sample(records))
        trace = ScoringTrace()
        t0 = time.perf_counter()
        try:
            results = await self.parts.scorer.score(
                records, started_ts=o.entry.ts, attempt=o.attempts, provenance=prov.digest, trace=trace
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any manager failure dead-letters its trajectory, never ends the worker
            if permission_refusal(exc, cfg.namespace, cfg.redis_url) is not None:
                raise  # Redis refused the manager a command: the worker's failure, not the trajectory's
            score_ms = (time.perf_counter() - t0) * 1000.0
            wait = await self.parts.retries.plan(shard, tid, data_source, exc)
            if wait is not None:
                return wait
            await self._fail(
                o,
                records,
                DeadLetterKind.SCORING,
                f"scoring failed: {type(exc).__name__}: {exc}{self.parts.retries.gave_up(tid)}",
                tb=traceback.format_exc(),
                failure=failure_kind_of(exc),
                extra_info=getattr(exc, "extra_info", None),
                data_source=data_source,
                scored=(trace, score_ms),
            )
            return "error"
        score_ms = (time.perf_counter() - t0) * 1000.0
        ticket = await self.parts.accounting.before_commit(o, records, results, prov, trace, score_ms)
        committed: bool | None = None
        try:
            committed = await self._commit(shard, tid, results)
        except NoRoom as exc:
            reason = await self._no_room_reason(tid, results, exc)
            await self._fail(o, records, DeadLetterKind.MEMORY, reason, data_source=data_source)
            return DeadLetterKind.MEMORY
        finally:
            self.parts.accounting.settle(ticket, committed)
        if committed is False:  # another worker's commit came first (a reclaimed lease): its results stand
            self.parts.stats["duplicates"] += 1
            return "ok"
        self.parts.stats["scored"] += 1  # the trajectories whose results this worker wrote
        self.parts.presence.scored(results.results[-1].latency_ms, outputs=results.n)
        return "ok"

    async def _commit(self, shard: int, tid: str, results: EncodedResults) -> bool:
        """Write back, then ack (one atomic script, sent with the other commits of this loop
        turn); True when it wrote the results (False: the trajectory was finished already). The
        connection's retry policy rides out a short outage (:mod:`rewardq.queue.retry`); a commit
        that still fails leaves the entries pending, to be reclaimed and scored again."""
        return await self.parts.commits.commit(shard, tid, results)

    async def _no_room_reason(self, tid: str, results: EncodedResults, exc: NoRoom) -> str:
        """Why ``tid``'s keys got an error result of kind ``memory``: its results' size and Redis's cap."""
        used, cap = await self.parts.broker.memory()
        figures = f"maxmemory {cap:,} bytes, used {used:,}" if cap else "its maxmemory unknown"
        return (
            f"Redis had no room for the results of {tid} ({results.n} keys, {results.written_bytes:,} bytes; "
            f"{figures}): {exc}; gave up after room_wait={self.parts.cfg.room_wait:g}s. Read and delete results "
            "faster, lower result_ttl or max_result_bytes, or raise Redis's maxmemory"
        )

    async def _fail(
        self,
        o: StoreOutcome,
        records: list[OutputRecord] | None,
        kind: DeadLetterKind,
        reason: str,
        *,
        tb: str = "",
        failure: FailureKind | None = None,
        extra_info: Mapping[str, object] | None = None,
        data_source: str = "",
        scored: tuple[ScoringTrace, float] | None = None,
    ) -> None:
        """Fail a whole trajectory (an error result for every key, a dead letter), ledger row first;
        ``failure``: its kind when the exception says (default: the dead letter's); ``data_source``:
        its sample's, for the failure counts; ``scored``: the trace and time of the manager's run
        that raised (its rows keep the response it decoded)."""
        failure = failure or DEAD_LETTER_FAILURE[kind]
        prov, rows = await self.parts.accounting.before_failure(o, records, reason, failure, scored)
        failed: Failed | None = None
        try:
            failed = await self.parts.failures.fail_trajectory(
                o.entry.shard,
                o.record.tid,
                o.entry,
                kind,
                reason,
                tb=tb,
                failure=failure,
                extra_info=extra_info,
                provenance=prov.digest,
                attempt=o.attempts,
                data_source=data_source,
            )
        finally:  # a key that had a result (another worker's) keeps it: its row must not outrank it
            self.parts.failures.settle(rows, failed)

    def _finished(self, tid: str, outcome: str, t0: float, data_source: str) -> None:
        manager = self.parts.cfg.manager
        self.parts.flights.finished(tid, handed_back=outcome == "handed-back")
        self.parts.retries.finished(tid)
        elapsed = (time.perf_counter() - t0) * 1000
        self.parts.metrics.trajectory_done(outcome, elapsed / 1000.0, data_source)
        self.log_summary.ended(outcome, elapsed)
        logger.debug(  # INFO says it in the summary line (rewardq.consumers.log_summary)
            "trajectory %s manager=%s outcome=%s elapsed_ms=%.1f",
            tid,
            manager,
            outcome,
            elapsed,
            extra={"tid": tid, "manager": manager, "outcome": outcome, "elapsed_ms": round(elapsed, 3)},
        )
