"""The reward worker: read -> store -> (when complete) score -> commit+ack.

One worker is one asyncio process. Its life, top to bottom (:meth:`Worker.run`):

1. ``start``      connect, check the Redis user's permissions, agree on shards, create groups,
                  build the manager, hold to the namespace's scoring configuration
                  (:mod:`rewardq.consumers.fleet`), set the manager up;
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
import contextlib
import json
import logging
import time
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rewardq import __version__, defaults
from rewardq.config import WorkerConfig
from rewardq.consumers.accounting import Accounting, open_ledger
from rewardq.consumers.assembly import assemble, trajectory_sample
from rewardq.consumers.batch import check_batch_bytes
from rewardq.consumers.commits import CommitCoalescer
from rewardq.consumers.failures import FailureHandler
from rewardq.consumers.fleet import FleetGate
from rewardq.consumers.inflight import InFlight, InFlightTable
from rewardq.consumers.intake import Intake
from rewardq.consumers.metrics import Metrics, NoMetrics
from rewardq.consumers.periodic import run_every
from rewardq.consumers.presence import COUNTERS, Presence
from rewardq.consumers.process import StopSignals, exit_after, freeze_startup_heap, limit_torch_threads
from rewardq.consumers.quarantine import Quarantine, crash_reason
from rewardq.consumers.reader import StreamReader, read_groups
from rewardq.consumers.resources import build_manager, close_manager, code_stats, open_broker, serve_metrics
from rewardq.consumers.scorer import TrajectoryScorer
from rewardq.errors import RecordError, ScoringConflict, TokenizerMismatch, TrajectoryTooLarge
from rewardq.logs import startup_step
from rewardq.queue.broker import StreamBroker
from rewardq.queue.codec import OutputRecord
from rewardq.queue.connection import connect_async, redact_url
from rewardq.queue.entries import Entry, StoreOutcome
from rewardq.queue.keys import Keyspace
from rewardq.queue.meta import default_worker_name
from rewardq.queue.provenance import publish as publish_provenance
from rewardq.queue.results import EncodedResults
from rewardq.queue.states import DEAD_LETTER_FAILURE, DeadLetterKind, FailureKind, failure_kind_of
from rewardq.reward.base import RewardManager
from rewardq.reward.fingerprint import tokenizer_fingerprint
from rewardq.reward.provenance import ProvenanceBook
from rewardq.reward.registry import is_builtin_manager
from rewardq.reward.scoring_fingerprint import scoring_fingerprint
from rewardq.reward.trace import ScoringTrace

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis
    from rewardq.reward.tokenizer import Tokenizer

logger = logging.getLogger("rewardq.worker")


class Worker:
    """A reward worker. ``await Worker(cfg).run()`` serves until stopped.

    Args:
        config: the settings (see :class:`~rewardq.config.WorkerConfig`).
        client: an existing ``redis.asyncio`` client (tests, the embedded demo); default:
            connect to ``config.redis_url``.
        manager: an already-built manager (tests); default: built from ``config``.
        tokenizer: used to bound token ids by ``vocab_size`` when given.
        metrics: the metrics hooks (tests); default: served on ``config.metrics_port`` if set.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        client: AsyncRedis | None = None,
        manager: RewardManager | None = None,
        tokenizer: Tokenizer | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.cfg = config
        self.name = config.name or default_worker_name()
        self._client = client
        self._own_client = client is None
        self.manager = manager
        self.tokenizer = tokenizer
        self.metrics: Metrics = metrics or NoMetrics()
        self._metrics_given = metrics is not None
        self.ks: Keyspace | None = None
        self.broker: StreamBroker | None = None
        self.scorer: TrajectoryScorer | None = None
        self.commits: CommitCoalescer | None = None
        self.failures: FailureHandler | None = None
        self.intake: Intake | None = None
        self.flights = InFlightTable(config.concurrency)
        self.stats = dict.fromkeys(COUNTERS, 0)
        self.presence = Presence(manager_name=config.manager, stats=self.stats, in_flight=self.flights.by_tid)
        self._stopping = asyncio.Event()
        self.quarantine: Quarantine | None = None  # ordinary trajectories side by side, quarantined ones alone
        self.stopped = False
        self._tasks: list[asyncio.Task[Any]] = []
        self.vocab_size: int | None = None
        self.tokenizer_fingerprint: str | None = None
        self.metrics_port: int | None = None
        self.gate: FleetGate | None = None
        self.ready = False  # started up and serving (start() finished every step)
        self.superseded: str | None = None  # why the namespace's scoring configuration is no longer ours
        self.accounting: Accounting | None = None  # provenance and the ledger (rewardq.consumers.accounting)

    @property
    def in_flight(self) -> dict[str, InFlight]:
        """The trajectories this worker holds, by id (:class:`~rewardq.consumers.inflight.InFlightTable`)."""
        return self.flights.by_tid

    # ==================================================================================
    # life cycle
    # ==================================================================================
    async def run(self, *, install_signal_handlers: bool = False, freeze_heap: bool = False) -> None:
        """Start, serve until :meth:`request_stop` (or SIGTERM/SIGINT), then stop cleanly.

        ``install_signal_handlers`` and ``freeze_heap`` (:func:`freeze_startup_heap`) are
        for a process that is the worker's own, as ``rewardq worker`` is. With the signal
        handlers (:class:`~rewardq.consumers.process.StopSignals`) the process ends within
        ``shutdown_grace`` + 5 s of SIGTERM, even when threads or children it started hang.
        """
        failed = True

        def exit_code() -> int:  # for a forced exit: 0 only when the worker had stopped cleanly
            return 0 if self.stopped and not failed else 1

        if install_signal_handlers:
            deadline = self.cfg.shutdown_grace + defaults.EXIT_AFTER_GRACE
            StopSignals(asyncio.get_running_loop(), self.request_stop, deadline=deadline, exit_code=exit_code).install()
        try:
            await self.start()
            if self.ready:
                if freeze_heap:
                    freeze_startup_heap()
                await self.serve()
            if self.superseded is not None:
                raise ScoringConflict(f"worker {self.name} stopped: {self.superseded}")
            failed = False
        finally:
            await self.stop()
            if install_signal_handlers:  # nothing left to wait for: leftover threads must not hold the exit
                exit_after(defaults.EXIT_AFTER_STOP, exit_code, why=f"worker {self.name} stopped")

    def request_stop(self, why: str = "requested") -> None:
        if not self._stopping.is_set():
            logger.info(
                "worker %s stopping (%s): no new reads; finishing %d in-flight trajectories",
                self.name,
                why,
                len(self.in_flight),
            )
            self._stopping.set()
            self.flights.capacity.set()

    async def start(self) -> None:
        """Start up, step by step, and set :attr:`ready`; a stop asked for before the worker could serve
        (a ``--takeover`` worker still waiting for the old ones) leaves it unset."""
        limit_torch_threads()
        await self._connect()
        self._build_manager()
        if not await self._join_fleet():
            return
        await self._set_up_manager()
        self._build_collaborators()
        self._open_accounts()
        await self._beat()
        self._announce()
        self.ready = True

    def _announce(self) -> None:
        cfg = self.cfg
        assert self.broker is not None
        logger.info(
            "worker %s started: redis=%s namespace=%s shards=%d group=%s manager=%s concurrency=%d scoring=%s",
            self.name,
            redact_url(cfg.redis_url),
            cfg.namespace,
            self.broker.ks.shards,
            cfg.group,
            cfg.manager,
            cfg.concurrency,
            self.presence.scoring,
        )

    async def _connect(self) -> None:
        """Connect, check the Redis user's permissions, agree on shards, create the groups."""
        if self._client is None:
            self._client = connect_async(self.cfg.redis_url, cluster=self.cfg.cluster, scripts_once=True)
        self.broker = broker = await open_broker(self._client, self.cfg, self.name)
        self.ks = broker.ks
        self.commits = CommitCoalescer(broker)
        self.quarantine = Quarantine(broker)

    def _build_manager(self) -> None:
        """The manager and tokenizer the config names (unless given), and the tokenizer's fingerprint."""
        if self.manager is None:
            assert self._client is not None
            self.manager, self.tokenizer = build_manager(self.cfg, self._client, self.name)
        self.vocab_size = getattr(self.tokenizer, "vocab_size", None) if self.tokenizer is not None else None
        self.tokenizer_fingerprint = tokenizer_fingerprint(self.tokenizer)

    async def _join_fleet(self) -> bool:
        """Hold to the scoring configuration the namespace records (:mod:`rewardq.consumers.fleet`)."""
        assert self.ks is not None and self._client is not None
        mine = scoring_fingerprint(self.cfg, self.tokenizer_fingerprint)
        self.presence.scoring = mine.digest
        self.gate = FleetGate(self._client, self.ks, mine, takeover=self.cfg.takeover, stopping=self._stopping.is_set)
        with startup_step(logger, "agreeing on the namespace's scoring configuration"):
            return await self.gate.join()

    async def _set_up_manager(self) -> None:
        """Set up the manager, start its scorer processes, serve the metrics."""
        assert self.manager is not None
        cfg = self.cfg
        with startup_step(logger, f"setting up the {cfg.manager} manager"):
            await self.manager.setup()
        with startup_step(logger, "starting the scorer processes"):
            await self.manager.prepare_scoring()
        if not self._metrics_given and cfg.metrics_port is not None:
            assert self.ks is not None and self._client is not None
            self.metrics, self.metrics_port = serve_metrics(cfg, self.manager, cfg.metrics_port, self._client, self.ks)

    def _build_collaborators(self) -> None:
        """Dead letters, intake and the trajectory scorer."""
        assert self.broker is not None and self.manager is not None
        cfg, broker = self.cfg, self.broker
        self.failures = FailureHandler(
            broker,
            worker_name=self.name,
            max_record_bytes=cfg.max_record_bytes,
            stats=self.stats,
            metrics=self.metrics,
        )
        self.intake = Intake(
            broker,
            self.failures,
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
        self.scorer = TrajectoryScorer(
            self.manager,
            manager_name=cfg.manager,
            worker_name=self.name,
            timeout=cfg.score_timeout,
            max_result_bytes=cfg.max_result_bytes,
            stopping=self._stopping.is_set,
        )

    def _open_accounts(self) -> None:
        """The provenance book and, with ``ledger`` set, the ledger (:mod:`rewardq.consumers.accounting`)."""
        assert self.manager is not None and self._client is not None and self.ks is not None
        client, ks, cfg = self._client, self.ks, self.cfg
        book = ProvenanceBook(
            self.manager,
            manager_spec=cfg.manager,
            scoring=self.presence.scoring,
            reward_fn=cfg.reward_fn,
            custom=not is_builtin_manager(cfg.manager),
            version=__version__,
        )

        async def publish(digest: str, blob: str) -> None:
            await publish_provenance(client, ks, digest, blob)

        with startup_step(logger, "opening the ledger") if cfg.ledger else contextlib.nullcontext():
            ledger = open_ledger(cfg, self.name)
        self.accounting = Accounting(book, publish, ledger, cfg.manager)
        self.metrics.watch_health(self.accounting.health.windows)
        if ledger is not None:
            self.metrics.watch_ledger(ledger.snapshot)

    async def serve(self) -> None:
        """Run the readers and the background loops until stopping."""
        assert self.broker is not None
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
        if self.accounting is not None and self.accounting.ledger is not None:
            self._tasks.append(asyncio.create_task(self.accounting.ledger.run(), name="ledger"))
        groups = read_groups(self.broker.ks.shards, self.broker.cluster)
        readers = [asyncio.create_task(reader.run(g), name=f"reader-{g[0]}") for g in groups]
        stop = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([*readers, stop], return_when=asyncio.FIRST_COMPLETED)
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
        self._stopping.set()
        self.flights.capacity.set()
        await self._finish_in_flight()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.accounting is not None and self.accounting.ledger is not None:
            await self.accounting.ledger.close(self.cfg.shutdown_grace)
        if self.broker is not None:
            try:
                await self.broker.unregister()
            except Exception:
                logger.debug("unregister failed", exc_info=True)
        self.metrics.close()
        if self.manager is not None:
            await close_manager(self.manager)
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None
        self.stopped = True
        logger.info("worker %s stopped: %s", self.name, self.stats)

    async def _finish_in_flight(self) -> None:
        """Let scoring finish within ``shutdown_grace``, send its commits, hand back what is left."""
        await self.flights.settle(self.cfg.shutdown_grace)
        if self.commits is not None:
            await self.commits.drain()
        if self.in_flight and self.broker is not None:
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
        assert self.intake is not None
        await self.intake.handle(entries)

    def _start_scoring(self, o: StoreOutcome) -> None:
        """Hold a trajectory this worker must score and score it in its own task."""
        flight = self.flights.hold(o.entry.shard, o.record.tid)
        if flight is not None:  # else held already: our own redelivery, which the commit will ack
            flight.task = asyncio.create_task(self._score_and_commit(o), name=f"score-{flight.tid}")

    async def _score_and_commit(self, o: StoreOutcome) -> None:
        """Wait for a slot and the quarantine gate, then score and commit (or fail) one trajectory."""
        assert self.quarantine is not None and self.failures is not None
        shard, tid = o.entry.shard, o.record.tid
        t0 = time.perf_counter()
        outcome = "ok"
        data_source = str(o.record.sample.get("data_source", ""))
        t_slot: float | None = None  # when it got a slot: its scoring time excludes the wait
        try:
            # in flight (its lease renewed) while it waits for a slot and its turn
            async with self.flights.slots, self.quarantine.turn(shard, tid, o.attempts, o.solo) as crashes:
                t_slot = time.perf_counter()
                if o.attempts > 1 and crashes >= self.cfg.max_crashes:
                    outcome = DeadLetterKind.CRASHED
                    await self._fail(o, o.records, outcome, crash_reason(crashes))
                else:
                    outcome = await self._score(o, shard, tid)
        except asyncio.CancelledError:  # the worker's own (the scorer turns any other into an error)
            outcome = "handed-back"
            raise
        except Exception as exc:
            outcome = "commit-failed"
            logger.exception("could not finish %s; its entry stays pending and will be reclaimed", tid)
            await self._note_unfinished(shard, tid, f"its result could not be written ({type(exc).__name__}: {exc})")
        finally:
            self._finished(tid, outcome, t0, data_source)
            if t_slot is not None and outcome != "handed-back":
                self.presence.finished(data_source, time.perf_counter() - t_slot)

    async def _note_unfinished(self, shard: int, tid: str, why: str) -> None:
        """Best effort: record why this attempt ended unanswered, for the dead letter of a trajectory
        that runs out of deliveries (so it never blames a crash that did not happen)."""
        assert self.broker is not None
        try:
            await self.broker.note_unfinished(shard, tid, why)
        except Exception as exc:  # noqa: BLE001 - Redis is likely what failed; the delivery count still counts
            logger.debug("could not record the failed attempt of %s: %s", tid, exc)

    async def _score(self, o: StoreOutcome, shard: int, tid: str) -> str:
        """Assemble, score and commit one trajectory (or fail it); returns the outcome to log."""
        assert self.scorer is not None and self.failures is not None and self.accounting is not None
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
        except TrajectoryTooLarge as exc:
            await self._fail(o, records, DeadLetterKind.INVALID, f"trajectory {tid}: {exc.message}")
            return DeadLetterKind.INVALID
        except TokenizerMismatch as exc:
            await self._fail(o, records, DeadLetterKind.TOKENIZER, str(exc))
            return DeadLetterKind.TOKENIZER
        except RecordError as exc:
            await self._fail(o, records, DeadLetterKind.INVALID, f"invalid record: {exc}")
            return DeadLetterKind.INVALID
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
            reason = f"scoring failed: {type(exc).__name__}: {exc}"
            await self._fail(
                o,
                records,
                DeadLetterKind.SCORING,
                reason,
                tb=traceback.format_exc(),
                failure=failure_kind_of(exc),
                extra_info=getattr(exc, "extra_info", None),
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
        assert self.commits is not None
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
    ) -> None:
        """Fail a whole trajectory (an error result for every key, a dead letter), ledger row first;
        ``failure``: its kind when the exception says (default: the dead letter's)."""
        assert self.failures is not None and self.accounting is not None
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
            )
            written = True
        finally:
            self.accounting.settle(ticket, written)

    def _finished(self, tid: str, outcome: str, t0: float, data_source: str) -> None:
        self.flights.finished(tid, handed_back=outcome == "handed-back")
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
        snap = self.presence.snapshot(code_stats(self.manager))
        if self.accounting is not None:
            ledger = self.accounting.snapshot()
            if ledger is not None:
                snap["ledger"] = json.dumps(ledger)
            health = self.accounting.health.snapshot()
            if health:
                snap["health"] = json.dumps(health, separators=(",", ":"))
        return snap

    async def _beat(self) -> None:
        assert self.broker is not None
        await self.broker.heartbeat(self.snapshot(), ttl=max(3 * self.cfg.heartbeat_interval, 5))

    async def _heartbeat(self) -> None:
        """Publish liveness and counters, and renew the leases of in-flight trajectories."""
        assert self.broker is not None
        await self._beat()
        if self.in_flight:
            await self.broker.renew(self.flights.held())
        self.metrics.in_flight(len(self.in_flight))
        if self.gate is not None and self.superseded is None:
            self.superseded = await self.gate.superseded()
            if self.superseded is not None:
                logger.error("worker %s superseded: %s", self.name, self.superseded)
                self.request_stop("superseded")

    async def maintain(self) -> None:
        """Reclaim idle entries of dead workers and end trajectories that waited too long."""
        assert self.broker is not None
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
                logger.warning("trajectory %s ended: %s", tid, reason)
