"""The reward worker: read -> store -> (when complete) score -> commit+ack.

One worker is one asyncio process. Its life, top to bottom:

1. ``open``       :mod:`rewardq.consumers.compose`, the one place a worker is put together, builds
                  the manager, connects, checks the Redis user's permissions, agrees on shards,
                  creates groups, holds to the namespace's scoring configuration
                  (:mod:`rewardq.consumers.scoring_gate`), sets the manager up, and hands every part to
                  :class:`Worker`, which holds no optional one; then :meth:`Worker.run`:
2. ``serve``      reader tasks pull batches with XREADGROUP and hand them to ``handle``;
                  background tasks beat the heart (and renew leases) and do maintenance
                  (reclaim idle entries of dead workers, end incomplete trajectories);
3. ``handle``     decode each entry (bad ones are dead-lettered with an error result for
                  their keys), store the rest; every trajectory that became complete is
                  scored in its own task, bounded by ``concurrency``;
4. ``score``      assemble, build the batch, run the manager, then **commit**: write every
                  key's result and acknowledge, in one atomic step. No ack before the write.
                  A reclaimed trajectory is scored beside the others; one that was in a
                  scorer when a worker stopped before is scored alone
                  (:mod:`rewardq.consumers.quarantine`), so a crash is blamed on it only;
5. ``stop``       on SIGTERM/SIGINT: stop reading, let in-flight scoring finish within
                  ``shutdown_grace``, hand back what is left, unregister, exit 0 (a process
                  of its own always ends within ``shutdown_grace`` + 5 s).

Delivery is at-least-once; the commit is idempotent, so a redelivered trajectory is
written with the same result and added once to the ``done`` stream.

:class:`Worker` owns the loop and what is in flight; each step's detail is a collaborator:
:class:`~rewardq.consumers.reader.StreamReader` (reading),
:class:`~rewardq.consumers.intake.Intake` (handling a batch),
:class:`~rewardq.consumers.scoring_round.ScoringRound` (one trajectory from its slot to its commit),
:class:`~rewardq.consumers.scorer.TrajectoryScorer` (scoring),
:class:`~rewardq.consumers.commits.CommitCoalescer` (committing),
:class:`~rewardq.consumers.failures.FailureHandler` (dead letters),
:class:`~rewardq.consumers.quarantine.Quarantine` (scoring alone), and
:mod:`rewardq.consumers.resources` (what is opened at start and closed at stop); the parts
it is handed are :class:`~rewardq.consumers.parts.WorkerParts`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Collection, Sequence
from typing import Any

from rewardq.consumers.failures import permission_refusal
from rewardq.consumers.inflight import InFlight
from rewardq.consumers.intake import Filed, Intake
from rewardq.consumers.log_summary import LogSummary
from rewardq.consumers.parts import WorkerParts
from rewardq.consumers.periodic import run_every
from rewardq.consumers.process import freeze_startup_heap
from rewardq.consumers.reader import StreamReader, read_groups
from rewardq.consumers.resources import close_manager, code_stats
from rewardq.consumers.scoring_round import ScoringRound
from rewardq.errors import RedisPermissionError, ScoringConflict
from rewardq.queue.cancels import CancelWatch
from rewardq.queue.connection import is_out_of_memory, redact_url
from rewardq.queue.entries import Entry, StoreOutcome
from rewardq.queue.keys import Keyspace
from rewardq.queue.states import DEAD_LETTER_FAILURE, DeadLetterKind

__all__ = ["CANCEL_POLL_SECONDS", "Worker", "WorkerParts"]

logger = logging.getLogger("rewardq.worker")

#: Seconds between two looks for cancelled trajectories (one GET each; :mod:`rewardq.queue.cancels`):
#: how long a cancelled trajectory may keep its judge calls in flight.
CANCEL_POLL_SECONDS = 0.25


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
        self.gate = parts.gate
        self.metrics = parts.metrics
        self.metrics_port = parts.metrics_port
        self._stopping = parts.stopping
        self.stats = parts.stats
        self.flights = parts.flights
        self.presence = parts.presence
        self.failures = parts.failures
        self.retries = parts.retries
        self.commits = parts.commits
        self.accounting = parts.accounting
        # the one collaborator that calls back into the worker, so it is made here
        self.intake = Intake(
            parts.broker,
            parts.failures,
            max_deliveries=cfg.max_deliveries,
            decode=parts.decoder,
            max_trajectory_bytes=cfg.max_trajectory_bytes,
            max_outputs=cfg.max_outputs,
            stats=self.stats,
            metrics=self.metrics,
            on_complete=self._start_scoring,
        )
        self.log_summary = LogSummary(self.name)  # the INFO line every log_summary_interval
        self.rounds = ScoringRound(parts, log_summary=self.log_summary, refused=self._refused)
        self.cancels = CancelWatch(parts.client, self.ks)
        self.stopped = False
        self._tasks: list[asyncio.Task[Any]] = []
        self.superseded: str | None = None  # why the namespace's scoring configuration is no longer ours
        self.refused: RedisPermissionError | None = None  # a command Redis stopped letting us run

    @property
    def in_flight(self) -> dict[str, InFlight]:
        """The trajectories this worker holds, by id (:class:`~rewardq.consumers.inflight.InFlightTable`)."""
        return self.flights.by_tid

    # ==================================================================================
    # life cycle
    # ==================================================================================
    async def run(self, *, freeze_heap: bool = False) -> None:
        """Serve until :meth:`request_stop`, then stop cleanly; raises ScoringConflict when another
        scoring configuration took the namespace over, and the one-line RedisPermissionError (exit
        code 2) when Redis stopped letting the worker run a command it needs (:meth:`_refused`).
        ``freeze_heap`` (:func:`freeze_startup_heap`) is for a process that is the worker's own, as
        ``rewardq worker`` is."""
        try:
            if freeze_heap:
                freeze_startup_heap()
            await self.serve()
            if self.superseded is not None and self.refused is None:
                raise ScoringConflict(f"worker {self.name} stopped: {self.superseded}")
        finally:
            await self.stop()
        if self.refused is not None:  # seen while serving or stopping
            raise self.refused

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
        groups = read_groups(self.broker.ks.shards, self.broker.cluster)
        reader = StreamReader(
            self.broker,
            handle=self.handle_read,
            stopping=self._stopping,
            capacity=self.flights.capacity,
            openings=self.flights.room,
            loops=len(groups),
            batch_size=cfg.batch_size,
            block_ms=cfg.block_ms or None,
            namespace=cfg.namespace,
            redis_url=cfg.redis_url,
            room=self.commits.room,
        )
        self._tasks = [
            asyncio.create_task(
                run_every(cfg.heartbeat_interval, self._heartbeat, "heartbeat", stops=self._refused), name="heartbeat"
            ),
            asyncio.create_task(
                run_every(cfg.maintenance_interval, self.maintain, "maintenance", stops=self._refused),
                name="maintenance",
            ),
            asyncio.create_task(
                run_every(CANCEL_POLL_SECONDS, self._stop_cancelled, "cancels", stops=self._refused), name="cancels"
            ),
        ]
        if cfg.log_summary_interval > 0:
            summary = run_every(cfg.log_summary_interval, self._log_summary, "log summary")
            self._tasks.append(asyncio.create_task(summary, name="log-summary"))
        if self.accounting.ledger is not None:
            self._tasks.append(asyncio.create_task(self.accounting.ledger.run(), name="ledger"))
        readers = [asyncio.create_task(reader.run(g), name=f"reader-{g[0]}") for g in groups]
        stop = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([*readers, stop], return_when=asyncio.FIRST_COMPLETED)
        self.flights.stop_admitting()  # a reader waiting for room must see the stop, however it was asked for
        failure: BaseException | None = None
        for t in done:
            raised = None if t is stop else t.exception()
            if raised is not None:
                failure = raised
                if not self._refused(raised):
                    self.request_stop(f"reader failed: {failure!r}")
        results = await asyncio.gather(*readers, return_exceptions=True)
        stop.cancel()
        failure = failure or next((r for r in results if isinstance(r, Exception)), None)
        if failure is not None and self._refused(failure):
            return  # :meth:`run` raises the one line
        if failure is not None:  # a dead reader must not look like a clean stop to a supervisor
            raise RuntimeError(f"worker {self.name} stopped because a reader failed: {failure!r}") from failure

    def _refused(self, exc: BaseException) -> bool:
        """Whether ``exc`` is (or was caused by) Redis refusing a command for lack of permission: an
        ACL changed while the worker runs. If so the worker stops, without blaming any trajectory:
        what it holds stays pending (handed back when Redis still lets it, else reclaimed after
        ``claim_idle``), and :meth:`run` raises the one line the start-up check gives (exit code 2)."""
        err = permission_refusal(exc, self.cfg.namespace, self.cfg.redis_url)
        if err is None:
            return False
        if self.refused is None:
            self.refused = err
            self.request_stop("Redis refused a command it needs: its user's permissions changed")
        return True

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
            await self.broker.liveness.unregister()
        except Exception:
            logger.debug("unregister failed", exc_info=True)
        self.metrics.close()
        await close_manager(self.manager)
        if self._own_client:
            await self._client.aclose()
        self.stopped = True
        if self.cfg.log_summary_interval > 0:
            self.log_summary.emit(len(self.in_flight))  # what ended since the last line
        logger.info("worker %s stopped: %s", self.name, self.stats)

    async def _finish_in_flight(self) -> None:
        """Let scoring finish within ``shutdown_grace``, send its commits, hand back what is left."""
        await self.flights.settle(self.cfg.shutdown_grace)
        await self.commits.drain()
        if self.in_flight:
            try:
                idle_ms = int(self.cfg.claim_idle * 1000) * 1000
                n = await self.broker.liveness.release(self.flights.held(), idle_ms=idle_ms)
                logger.warning("worker %s handed back %d unfinished trajectories", self.name, n)
            except Exception as exc:
                if self._refused(exc):
                    logger.warning(
                        "could not hand back %d in-flight trajectories (Redis refused the command); they will "
                        "be reclaimed after claim_idle=%ss",
                        len(self.in_flight),
                        self.cfg.claim_idle,
                    )
                    return
                logger.exception(
                    "could not hand back in-flight trajectories; they will be reclaimed after claim_idle=%ss",
                    self.cfg.claim_idle,
                )

    # ==================================================================================
    # handle a batch -> score each complete trajectory -> commit (its round: ScoringRound)
    # ==================================================================================
    async def handle(self, entries: list[Entry]) -> None:
        """Decode, store and dispatch a batch of entries (from a read or a reclaim; see :class:`Intake`)."""
        await self.intake.handle(entries)

    async def handle_read(self, entries: list[Entry], carried: Sequence[Filed], full: Collection[int]) -> list[Filed]:
        """A read's batch, with what the read before held back; returns what this one holds back for
        the next (of the shards in ``full``, whose next read follows at once; :meth:`Intake.handle`)."""
        return await self.intake.handle(entries, carried, hold_tail=full)

    def _start_scoring(self, o: StoreOutcome) -> None:
        """Hold a trajectory this worker must score and score it in its own task."""
        flight = self.flights.hold(o.entry.shard, o.record.tid)
        if flight is not None:  # else held already: our own redelivery, which the commit will ack
            flight.task = asyncio.create_task(self.rounds.run(o), name=f"score-{flight.tid}")

    # ==================================================================================
    # background: heartbeat + lease renewal, maintenance, the log's summary line
    # ==================================================================================
    async def _log_summary(self) -> None:
        self.log_summary.emit(len(self.in_flight))

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
        if self.broker.liveness.shared_name_at:  # another live process beat under this name
            snap["shared_name_at"] = f"{self.broker.liveness.shared_name_at:.3f}"
        return snap

    async def beat(self) -> None:
        """Publish liveness and counters (the heartbeat, without renewing leases)."""
        await self.broker.liveness.heartbeat(self.snapshot(), ttl=max(3 * self.cfg.heartbeat_interval, 5))

    async def _heartbeat(self) -> None:
        """Publish liveness and counters, and renew the leases of in-flight trajectories."""
        if self.in_flight:  # first: the leases matter more than the counters
            await self.broker.liveness.renew(self.flights.held())
        await self.beat()
        self.metrics.in_flight(len(self.in_flight), len(self.flights.resting))
        if self.superseded is None:
            self.superseded = await self.gate.superseded()
            if self.superseded is not None:
                logger.error("worker %s superseded: %s", self.name, self.superseded)
                self.request_stop("superseded")

    async def _stop_cancelled(self) -> None:
        """Stop scoring the held trajectories their producers cancelled (:mod:`rewardq.queue.cancels`)."""
        if not self.in_flight:
            return
        for tid in await self.cancels.cancelled(self.flights.held()):
            flight = self.in_flight.get(tid)
            if flight is not None and not flight.cancelled:
                logger.info("trajectory %s cancelled by its producer: scoring stopped", tid)
                flight.cancel()

    async def maintain(self) -> None:
        """Reclaim idle entries of dead workers and end trajectories that waited too long.

        A reclaim takes what :meth:`InFlightTable.reclaim_room
        <rewardq.consumers.inflight.InFlightTable.reclaim_room>` allows, busy or not: a dead worker's
        entries are taken over within ``claim_idle`` plus one ``maintenance_interval``, not once the
        fleet has run out of other work."""
        for shard in range(self.broker.ks.shards):
            if self._stopping.is_set():
                return
            room = self.flights.reclaim_room()
            if room:
                idle_ms = int(self.cfg.claim_idle * 1000)
                claimed = await self.broker.reclaim(shard, idle_ms, self.cfg.batch_size, trajectories=room)
                if claimed:
                    self.stats["reclaimed"] += len(claimed)
                    self.metrics.reclaimed(len(claimed))
                    logger.info("reclaimed %d idle entries on shard %d", len(claimed), shard)
                    await self.handle(claimed)
            try:
                ended = await self.broker.expire_incomplete(shard, records_bytes=self.accounting.expired_records_bytes)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                logger.info("Redis is past its maxmemory: incomplete trajectories end at a later pass")
                return
            for e in ended:  # spooled with no await between the script and the rows: a stop cannot cut it
                tid, reason = e.tid, e.reason
                self.accounting.spool_expired(
                    e, max_record_bytes=self.cfg.max_record_bytes, max_outputs=self.cfg.max_outputs
                )
                self.stats["expired"] += 1
                self.stats["errors"] += 1
                self.metrics.dead_letter(DeadLetterKind.INCOMPLETE)
                self.failures.count_failure(DEAD_LETTER_FAILURE[DeadLetterKind.INCOMPLETE], "")
                logger.warning("trajectory %s ended: %s", tid, reason)
