"""The reward worker: read -> store -> (when complete) score -> commit+ack.

One worker is one asyncio process. Its life, top to bottom:

1. ``open``       :mod:`rewardq.consumers.compose`, the one place a worker is put together, builds
                  the manager, connects, checks the Redis user's permissions, agrees on shards,
                  creates groups, holds to the namespace's scoring configuration
                  (:mod:`rewardq.consumers.fleet`), sets the manager up, and hands every part to
                  :class:`Worker`, which holds no optional one; then :meth:`Worker.run`:
2. ``serve``      reader tasks pull batches with XREADGROUP and hand them to ``handle``;
                  background tasks beat the heart (and renew leases) and do maintenance
                  (reclaim idle entries of dead workers, end incomplete trajectories);
3. ``handle``     decode each entry (bad ones are dead-lettered with an error result for
                  their keys), store the rest; every trajectory that became complete is
                  scored in its own task, bounded by ``concurrency``;
4. ``score``      assemble, build the batch, run the manager, then **commit**: write every
                  key's result and acknowledge, in one atomic step. No ack before the write.
                  A trajectory whose earlier attempt never finished is scored alone
                  (:mod:`rewardq.consumers.quarantine`), so a crash is blamed on it only;
5. ``stop``       on SIGTERM/SIGINT: stop reading, let in-flight scoring finish within
                  ``shutdown_grace``, hand back what is left, unregister, exit 0 (a process
                  of its own always ends within ``shutdown_grace`` + 5 s).

Delivery is at-least-once; the commit is idempotent, so a redelivered trajectory is
written with the same result and added once to the ``done`` stream.

:class:`Worker` owns the loop and what is in flight; each step's detail is a collaborator:
:class:`~rewardq.consumers.reader.StreamReader` (reading),
:class:`~rewardq.consumers.intake.Intake` (handling a batch),
:class:`~rewardq.consumers.scorer.TrajectoryScorer` (scoring),
:class:`~rewardq.consumers.commits.CommitCoalescer` (committing),
:class:`~rewardq.consumers.failures.FailureHandler` (dead letters),
:class:`~rewardq.consumers.quarantine.Quarantine` (scoring alone), and
:mod:`rewardq.consumers.resources` (what is opened at start and closed at stop).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewardq.config import WorkerConfig
from rewardq.consumers.accounting import Accounting
from rewardq.consumers.assembly import assemble, trajectory_sample
from rewardq.consumers.batch import check_batch_bytes
from rewardq.consumers.commits import CommitCoalescer
from rewardq.consumers.failures import FailureHandler, refusal
from rewardq.consumers.fleet import FleetGate
from rewardq.consumers.inflight import InFlight, InFlightTable
from rewardq.consumers.intake import Intake
from rewardq.consumers.metrics import Metrics
from rewardq.consumers.periodic import run_every
from rewardq.consumers.presence import Presence
from rewardq.consumers.process import freeze_startup_heap
from rewardq.consumers.quarantine import Quarantine, crash_reason
from rewardq.consumers.reader import StreamReader, read_groups
from rewardq.consumers.resources import close_manager, code_stats
from rewardq.consumers.retries import Retries, RetryWait
from rewardq.consumers.scorer import TrajectoryScorer
from rewardq.errors import RecordError, ScoringConflict
from rewardq.queue.broker import StreamBroker
from rewardq.queue.codec import OutputRecord
from rewardq.queue.connection import redact_url
from rewardq.queue.entries import Entry, StoreOutcome
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import EncodedResults
from rewardq.queue.states import DEAD_LETTER_FAILURE, DeadLetterKind, FailureKind, failure_kind_of
from rewardq.reward.base import RewardManager
from rewardq.reward.trace import ScoringTrace

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis
    from rewardq.reward.tokenizer import Tokenizer

logger = logging.getLogger("rewardq.worker")


@dataclass(frozen=True)
class WorkerParts:
    """Every part a :class:`Worker` holds, built by :mod:`rewardq.consumers.compose`.

    ``owns_client``: the worker closes ``client`` when it stops (it connected itself);
    ``metrics_port``: where the metrics are served (None: not served); ``stopping``: set to stop.
    """

    cfg: WorkerConfig
    name: str
    client: AsyncRedis
    owns_client: bool
    broker: StreamBroker
    manager: RewardManager
    tokenizer: Tokenizer | None
    tokenizer_fingerprint: str | None
    gate: FleetGate
    metrics: Metrics
    metrics_port: int | None
    stopping: asyncio.Event
    stats: dict[str, int]
    flights: InFlightTable
    presence: Presence
    failures: FailureHandler
    retries: Retries  # transient failures retried in place (rewardq.consumers.retries)
    scorer: TrajectoryScorer
    commits: CommitCoalescer
    quarantine: Quarantine
    accounting: Accounting  # provenance and the ledger (rewardq.consumers.accounting)


class Worker:
    """A started reward worker: :meth:`run` serves until stopped, then stops.

    Made by :func:`rewardq.consumers.compose.open_worker` (``run_worker`` for the whole life),
    never directly: ``await open_worker(prepare_worker(cfg))``.
    """

    def __init__(self, parts: WorkerParts) -> None:
        cfg = self.cfg = parts.cfg
        self.name = parts.name
        self._client = parts.client
        self._own_client = parts.owns_client
        self.broker = parts.broker
        self.ks: Keyspace = parts.broker.ks
        self.manager = parts.manager
        self.tokenizer = parts.tokenizer
        self.vocab_size: int | None = getattr(parts.tokenizer, "vocab_size", None)
        self.tokenizer_fingerprint = parts.tokenizer_fingerprint
        self.gate = parts.gate
        self.metrics = parts.metrics
        self.metrics_port = parts.metrics_port
        self._stopping = parts.stopping
        self.stats = parts.stats
        self.flights = parts.flights
        self.presence = parts.presence
        self.failures = parts.failures
        self.retries = parts.retries
        self.scorer = parts.scorer
        self.commits = parts.commits
        self.quarantine = parts.quarantine  # ordinary trajectories side by side, quarantined ones alone
        self.accounting = parts.accounting
        # the one collaborator that calls back into the worker, so it is made here
        self.intake = Intake(
            parts.broker,
            parts.failures,
            max_deliveries=cfg.max_deliveries,
            max_record_bytes=cfg.max_record_bytes,
            max_trajectory_bytes=cfg.max_trajectory_bytes,
            max_outputs=cfg.max_outputs,
            vocab_size=self.vocab_size,
            tokenizer=self.tokenizer_fingerprint,
            stats=self.stats,
            metrics=self.metrics,
            on_complete=self._start_scoring,
            max_image_bytes=cfg.max_image_bytes,
        )
        self.stopped = False
        self._tasks: list[asyncio.Task[Any]] = []
        self.superseded: str | None = None  # why the namespace's scoring configuration is no longer ours

    @property
    def in_flight(self) -> dict[str, InFlight]:
        """The trajectories this worker holds, by id (:class:`~rewardq.consumers.inflight.InFlightTable`)."""
        return self.flights.by_tid

    # ==================================================================================
    # life cycle
    # ==================================================================================
    async def run(self, *, freeze_heap: bool = False) -> None:
        """Serve until :meth:`request_stop`, then stop cleanly; raises ScoringConflict when another
        scoring configuration took the namespace over. ``freeze_heap`` (:func:`freeze_startup_heap`)
        is for a process that is the worker's own, as ``rewardq worker`` is."""
        try:
            if freeze_heap:
                freeze_startup_heap()
            await self.serve()
            if self.superseded is not None:
                raise ScoringConflict(f"worker {self.name} stopped: {self.superseded}")
        finally:
            await self.stop()

    def request_stop(self, why: str = "requested") -> None:
        if not self._stopping.is_set():
            logger.info(
                "worker %s stopping (%s): no new reads; finishing %d in-flight trajectories",
                self.name,
                why,
                len(self.in_flight),
            )
            self._stopping.set()
            self.flights.stop_admitting()

    def announce(self) -> None:
        """The line that says the worker started, and with what."""
        cfg = self.cfg
        logger.info(
            "worker %s started: redis=%s namespace=%s shards=%d group=%s manager=%s concurrency=%d scoring=%s",
            self.name,
            redact_url(cfg.redis_url),
            cfg.namespace,
            self.ks.shards,
            cfg.group,
            cfg.manager,
            cfg.concurrency,
            self.presence.scoring,
        )

    async def serve(self) -> None:
        """Run the readers and the background loops until stopping."""
        cfg = self.cfg
        reader = StreamReader(
            self.broker,
            handle=self.handle,
            stopping=self._stopping,
            capacity=self.flights.capacity,
            batch_size=cfg.batch_size,
            block_ms=cfg.block_ms or None,
            namespace=cfg.namespace,
            redis_url=cfg.redis_url,
        )
        self._tasks = [
            asyncio.create_task(run_every(cfg.heartbeat_interval, self._heartbeat, "heartbeat"), name="heartbeat"),
            asyncio.create_task(run_every(cfg.maintenance_interval, self.maintain, "maintenance"), name="maintenance"),
        ]
        if self.accounting.ledger is not None:
            self._tasks.append(asyncio.create_task(self.accounting.ledger.run(), name="ledger"))
        groups = read_groups(self.broker.ks.shards, self.broker.cluster)
        readers = [asyncio.create_task(reader.run(g), name=f"reader-{g[0]}") for g in groups]
        stop = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([*readers, stop], return_when=asyncio.FIRST_COMPLETED)
        self.flights.stop_admitting()  # a reader waiting for room must see the stop, however it was asked for
        failure: BaseException | None = None
        for t in done:
            if t is not stop and t.exception() is not None:
                failure = t.exception()
                self.request_stop(f"reader failed: {failure!r}")
        results = await asyncio.gather(*readers, return_exceptions=True)
        stop.cancel()
        failure = failure or next((r for r in results if isinstance(r, Exception)), None)
        if failure is not None:  # a dead reader must not look like a clean stop to a supervisor
            raise RuntimeError(f"worker {self.name} stopped because a reader failed: {failure!r}") from failure

    async def stop(self) -> None:
        """Finish or hand back in-flight work, unregister, close. Safe to call twice."""
        if self.stopped:
            return
        self._stopping.set()
        self.flights.stop_admitting()
        await self._finish_in_flight()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.accounting.ledger is not None:
            await self.accounting.ledger.close(self.cfg.shutdown_grace)
        try:
            await self.broker.unregister()
        except Exception:
            logger.debug("unregister failed", exc_info=True)
        self.metrics.close()
        await close_manager(self.manager)
        if self._own_client:
            await self._client.aclose()
        self.stopped = True
        logger.info("worker %s stopped: %s", self.name, self.stats)

    async def _finish_in_flight(self) -> None:
        """Let scoring finish within ``shutdown_grace``, send its commits, hand back what is left."""
        await self.flights.settle(self.cfg.shutdown_grace)
        await self.commits.drain()
        if self.in_flight:
            try:
                n = await self.broker.release(self.flights.held(), idle_ms=int(self.cfg.claim_idle * 1000) * 1000)
                logger.warning("worker %s handed back %d unfinished trajectories", self.name, n)
            except Exception:
                logger.exception(
                    "could not hand back in-flight trajectories; they will be reclaimed after claim_idle=%ss",
                    self.cfg.claim_idle,
                )

    # ==================================================================================
    # handle a batch -> score each complete trajectory -> commit
    # ==================================================================================
    async def handle(self, entries: list[Entry]) -> None:
        """Decode, store and dispatch a batch of entries (from a read or a reclaim; see :class:`Intake`)."""
        await self.intake.handle(entries)

    def _start_scoring(self, o: StoreOutcome) -> None:
        """Hold a trajectory this worker must score and score it in its own task."""
        flight = self.flights.hold(o.entry.shard, o.record.tid)
        if flight is not None:  # else held already: our own redelivery, which the commit will ack
            flight.task = asyncio.create_task(self._score_and_commit(o), name=f"score-{flight.tid}")

    async def _score_and_commit(self, o: StoreOutcome) -> None:
        """Score and commit (or fail) one trajectory, each try with a slot and its quarantine turn;
        after a transient failure, rest without a slot until its retry is due (:mod:`.retries`)."""
        shard, tid = o.entry.shard, o.record.tid
        t0 = time.perf_counter()
        outcome = "ok"
        data_source = str(o.record.sample.get("data_source", ""))
        scoring_s: float | None = None  # time spent holding a slot: its scoring time excludes the waits
        try:
            while True:
                # in flight (its lease renewed) while it waits for a slot and its turn
                async with self.flights.slots, self._turn(o) as crashes:
                    t_slot = time.perf_counter()
                    try:
                        tried = await self._try(o, crashes, data_source)
                    finally:
                        scoring_s = (scoring_s or 0.0) + time.perf_counter() - t_slot
                if not isinstance(tried, RetryWait):
                    outcome = tried
                    break
                if not await self._rest(o, tried):
                    outcome = "handed-back"
                    break
        except asyncio.CancelledError:  # the worker's own (the scorer turns any other into an error)
            outcome = "handed-back"
            raise
        except Exception as exc:
            outcome = "commit-failed"
            logger.exception("could not finish %s; its entry stays pending and will be reclaimed", tid)
            await self._note_unfinished(shard, tid, f"its result could not be written ({type(exc).__name__}: {exc})")
        finally:
            self._finished(tid, outcome, t0, data_source)
            if scoring_s is not None and outcome != "handed-back":
                self.presence.finished(data_source, scoring_s)

    def _turn(self, o: StoreOutcome) -> AbstractAsyncContextManager[int]:
        """The quarantine turn of ``o``'s trajectory (alone after an attempt that never finished)."""
        return self.quarantine.turn(o.entry.shard, o.record.tid, o.attempts, o.solo)

    async def _try(self, o: StoreOutcome, crashes: int, data_source: str) -> str | RetryWait:
        """One try at a trajectory, holding its slot and turn: its outcome, or the wait before the next try."""
        if o.attempts > 1 and crashes >= self.cfg.max_crashes:
            await self._fail(o, o.records, DeadLetterKind.CRASHED, crash_reason(crashes), data_source=data_source)
            return DeadLetterKind.CRASHED
        return await self._score(o, o.entry.shard, o.record.tid, data_source)

    async def _rest(self, o: StoreOutcome, wait: RetryWait) -> bool:
        """Wait for a retry, holding no slot (its lease renewed); False when the worker stops first:
        the trajectory is then handed back. A quarantined trajectory's start alone is taken back
        (it crashed nothing), to be counted again when it starts again."""
        if o.attempts > 1:
            await self.quarantine.handed_back(o.entry.shard, o.record.tid)
        self.flights.rest(o.record.tid)
        try:
            return await self.retries.wait(wait)
        finally:
            self.flights.wake(o.record.tid)

    async def _note_unfinished(self, shard: int, tid: str, why: str) -> None:
        """Best effort: record why this attempt ended unanswered, for the dead letter of a trajectory
        that runs out of deliveries (so it never blames a crash that did not happen)."""
        try:
            await self.broker.note_unfinished(shard, tid, why)
        except Exception as exc:  # noqa: BLE001 - Redis is likely what failed; the delivery count still counts
            logger.debug("could not record the failed attempt of %s: %s", tid, exc)

    async def _score(self, o: StoreOutcome, shard: int, tid: str, data_source: str) -> str | RetryWait:
        """Assemble, score and commit one trajectory (or fail it); returns the outcome to log, or the
        wait before it is scored again after a transient failure (:mod:`rewardq.consumers.retries`)."""
        records: list[OutputRecord] | None = None
        try:
            records = o.records or assemble(
                tid,
                o.payloads,
                max_bytes=self.cfg.max_record_bytes,
                vocab_size=self.vocab_size,
                known=o.record,
                max_outputs=self.cfg.max_outputs,
                max_image_bytes=self.cfg.max_image_bytes,
                tokenizer=self.tokenizer_fingerprint,
            )
            check_batch_bytes(records, self.cfg.max_batch_bytes)  # before the batch is built
        except RecordError as exc:
            kind, why = refusal(exc, tid)
            await self._fail(o, records, kind, why, data_source=data_source)
            return kind
        o.records = records  # a retry scores the same records again
        prov = self.accounting.provenance_of(trajectory_sample(records))
        trace = ScoringTrace()
        t0 = time.perf_counter()
        try:
            results = await self.scorer.score(
                records, started_ts=o.entry.ts, attempt=o.attempts, provenance=prov.digest, trace=trace
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any manager failure dead-letters its trajectory, never ends the worker
            wait = await self.retries.plan(shard, tid, data_source, exc)
            if wait is not None:
                return wait
            await self._fail(
                o,
                records,
                DeadLetterKind.SCORING,
                f"scoring failed: {type(exc).__name__}: {exc}{self.retries.gave_up(tid)}",
                tb=traceback.format_exc(),
                failure=failure_kind_of(exc),
                extra_info=getattr(exc, "extra_info", None),
                data_source=data_source,
            )
            return "error"
        score_ms = (time.perf_counter() - t0) * 1000.0
        ticket = await self.accounting.before_commit(o, records, results, prov, trace, score_ms)
        committed: bool | None = None
        try:
            committed = await self._commit(shard, tid, results)
        finally:
            self.accounting.settle(ticket, committed)
        self.stats["scored"] += 1
        self.presence.scored(results.results[-1].latency_ms, outputs=results.n)
        return "ok"

    async def _commit(self, shard: int, tid: str, results: EncodedResults) -> bool:
        """Write back, then ack (one atomic script, sent with the other commits of this loop
        turn); True when it wrote the results (False: the trajectory was finished already). The
        connection's retry policy rides out a short outage (:mod:`rewardq.queue.retry`); a commit
        that still fails leaves the entries pending, to be reclaimed and scored again."""
        return await self.commits.commit(shard, tid, results)

    async def _fail(
        self,
        o: StoreOutcome,
        records: list[OutputRecord] | None,
        kind: DeadLetterKind,
        reason: str,
        *,
        tb: str = "",
        failure: FailureKind | None = None,
        extra_info: Mapping[str, Any] | None = None,
        data_source: str = "",
    ) -> None:
        """Fail a whole trajectory (an error result for every key, a dead letter), ledger row first;
        ``failure``: its kind when the exception says (default: the dead letter's); ``data_source``:
        its sample's, for the failure counts."""
        failure = failure or DEAD_LETTER_FAILURE[kind]
        prov, ticket = await self.accounting.before_failure(o, records, reason, failure)
        written: bool | None = None
        try:
            await self.failures.fail_trajectory(
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
            written = True
        finally:
            self.accounting.settle(ticket, written)

    def _finished(self, tid: str, outcome: str, t0: float, data_source: str) -> None:
        self.flights.finished(tid, handed_back=outcome == "handed-back")
        self.retries.finished(tid)
        elapsed = (time.perf_counter() - t0) * 1000
        self.metrics.trajectory_done(outcome, elapsed / 1000.0, data_source)
        logger.info(
            "trajectory %s manager=%s outcome=%s elapsed_ms=%.1f",
            tid,
            self.cfg.manager,
            outcome,
            elapsed,
            extra={"tid": tid, "manager": self.cfg.manager, "outcome": outcome, "elapsed_ms": round(elapsed, 3)},
        )

    # ==================================================================================
    # background: heartbeat + lease renewal, maintenance
    # ==================================================================================
    def snapshot(self) -> dict[str, Any]:
        """What the heartbeat publishes (:class:`~rewardq.consumers.presence.Presence`)."""
        self.presence.retrying = self.retries.snapshot(time.time())
        snap = self.presence.snapshot(code_stats(self.manager))
        ledger = self.accounting.snapshot()
        if ledger is not None:
            snap["ledger"] = json.dumps(ledger)
        health = self.accounting.health.snapshot()
        if health:
            snap["health"] = json.dumps(health, separators=(",", ":"))
        return snap

    async def beat(self) -> None:
        """Publish liveness and counters (the heartbeat, without renewing leases)."""
        await self.broker.heartbeat(self.snapshot(), ttl=max(3 * self.cfg.heartbeat_interval, 5))

    async def _heartbeat(self) -> None:
        """Publish liveness and counters, and renew the leases of in-flight trajectories."""
        await self.beat()
        if self.in_flight:
            await self.broker.renew(self.flights.held())
        self.metrics.in_flight(len(self.in_flight), len(self.flights.resting))
        if self.superseded is None:
            self.superseded = await self.gate.superseded()
            if self.superseded is not None:
                logger.error("worker %s superseded: %s", self.name, self.superseded)
                self.request_stop("superseded")

    async def maintain(self) -> None:
        """Reclaim idle entries of dead workers and end trajectories that waited too long."""
        for shard in range(self.broker.ks.shards):
            if self._stopping.is_set():
                return
            if self.flights.capacity.is_set():
                claimed = await self.broker.reclaim(shard, int(self.cfg.claim_idle * 1000), self.cfg.batch_size)
                if claimed:
                    self.stats["reclaimed"] += len(claimed)
                    self.metrics.reclaimed(len(claimed))
                    logger.info("reclaimed %d idle entries on shard %d", len(claimed), shard)
                    await self.handle(claimed)
            for tid, reason in await self.broker.expire_incomplete(shard):
                self.stats["expired"] += 1
                self.stats["errors"] += 1
                self.metrics.dead_letter(DeadLetterKind.INCOMPLETE)
                self.failures.count_failure(DEAD_LETTER_FAILURE[DeadLetterKind.INCOMPLETE], "")
                logger.warning("trajectory %s ended: %s", tid, reason)
