"""The reward worker: read -> store -> (when complete) score -> commit+ack.

One worker is one asyncio process. Its life, top to bottom (:meth:`Worker.run`):

1. ``start``      connect, agree on shards, create groups, set up the manager;
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
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoPermissionError

from rewardq import defaults
from rewardq.config import WorkerConfig
from rewardq.consumers.assembly import assemble
from rewardq.consumers.commits import CommitCoalescer
from rewardq.consumers.failures import FailureHandler
from rewardq.consumers.metrics import Metrics, NoMetrics
from rewardq.consumers.process import StopSignals, exit_after, freeze_startup_heap, limit_torch_threads
from rewardq.consumers.quarantine import Quarantine, crash_reason
from rewardq.consumers.scorer import TrajectoryScorer
from rewardq.errors import RecordError
from rewardq.queue.aio import being_cancelled
from rewardq.queue.broker import Entry, StoreOutcome, StreamBroker, default_worker_name, ensure_meta
from rewardq.queue.codec import decode_output
from rewardq.queue.connection import connect_async, is_cluster_client, permission_error, redact_url
from rewardq.queue.keys import Keyspace
from rewardq.queue.retry import backoff_delay, is_transient
from rewardq.reward.base import ManagerContext, RewardManager

logger = logging.getLogger("rewardq.worker")


@dataclass
class InFlight:
    shard: int
    tid: str
    started: float
    task: asyncio.Task | None = None


class Worker:
    """A reward worker. ``await Worker(cfg).run()`` serves until stopped.

    Args:
        config: the settings (see :class:`~rewardq.config.WorkerConfig`).
        client: an existing ``redis.asyncio`` client (tests, the embedded demo); default:
            connect to ``config.redis_url``.
        manager: an already-built manager (tests); default: built from ``config``.
        tokenizer: used to bound token ids by ``vocab_size`` when given.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        client: Any = None,
        manager: RewardManager | None = None,
        tokenizer: Any = None,
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
        self.in_flight: dict[str, InFlight] = {}
        self.stats = {
            "read": 0,
            "stored": 0,
            "parked": 0,
            "scored": 0,
            "errors": 0,
            "dead_letters": 0,
            "reclaimed": 0,
            "duplicates": 0,
            "expired": 0,
        }
        self._recent: deque[tuple[float, float]] = deque(maxlen=512)  # (time, latency_ms)
        self._stopping = asyncio.Event()
        self._capacity = asyncio.Event()  # set while fewer than `concurrency` trajectories are held
        self._slots = asyncio.Semaphore(config.concurrency)  # at most `concurrency` scored at once
        self.quarantine: Quarantine | None = None  # ordinary trajectories side by side, quarantined ones alone
        self.stopped = False
        self._capacity.set()
        self._tasks: list[asyncio.Task] = []
        self._started_at = time.time()
        self.vocab_size: int | None = None
        self.metrics_port: int | None = None

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
            if freeze_heap:
                freeze_startup_heap()
            await self.serve()
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
            self._capacity.set()

    async def start(self) -> None:
        cfg = self.cfg
        limit_torch_threads()
        if self._client is None:
            self._client = connect_async(cfg.redis_url, cluster=cfg.cluster, scripts_once=True)
        client = self._client
        probe = Keyspace(cfg.namespace, 1, cfg.group)
        try:
            shards = await ensure_meta(client, probe, cfg.shards)
        except NoPermissionError as exc:
            raise permission_error(exc, cfg.namespace, cfg.redis_url) from None
        self.ks = Keyspace(cfg.namespace, shards, cfg.group)
        self.broker = StreamBroker(
            client,
            self.ks,
            worker=self.name,
            result_ttl=cfg.result_ttl,
            lease_seconds=cfg.lease_seconds,
            incomplete_timeout=cfg.incomplete_timeout,
            keep_records=cfg.keep_records,
            max_outputs=cfg.max_outputs,
        )
        try:
            await self.broker.ensure_groups()
        except NoPermissionError as exc:
            raise permission_error(exc, cfg.namespace, cfg.redis_url) from None
        self.commits = CommitCoalescer(self.broker)
        self.quarantine = Quarantine(self.broker)
        if self.manager is None:
            from rewardq.reward.factory import build_from_config

            ctx = ManagerContext(
                redis_url=cfg.redis_url,
                namespace=cfg.namespace,
                worker_name=self.name,
                cluster=is_cluster_client(client),
            )
            self.manager, self.tokenizer = build_from_config(cfg, ctx)
        self.vocab_size = getattr(self.tokenizer, "vocab_size", None) if self.tokenizer is not None else None
        await self.manager.setup()
        await self.manager.prepare_scoring()
        if not self._metrics_given and cfg.metrics_port is not None:
            from rewardq.consumers.metrics import WorkerMetrics

            stats = getattr(self.manager, "stats", None)
            code = self._code_stats()
            served = WorkerMetrics(
                cfg.manager,
                limiter_stats=stats if callable(stats) else None,
                code_stats=code.snapshot if code is not None else None,
            )
            self.metrics_port = served.serve(cfg.metrics_port)
            self.metrics = served
            logger.info("metrics on http://0.0.0.0:%d/metrics", self.metrics_port)
        self.failures = FailureHandler(
            self.broker,
            self.ks,
            worker_name=self.name,
            max_record_bytes=cfg.max_record_bytes,
            stats=self.stats,
            metrics=self.metrics,
        )
        self.scorer = TrajectoryScorer(
            self.manager, manager_name=cfg.manager, worker_name=self.name, timeout=cfg.score_timeout
        )
        await self._beat()
        logger.info(
            "worker %s started: redis=%s namespace=%s shards=%d group=%s manager=%s concurrency=%d",
            self.name,
            redact_url(cfg.redis_url),
            cfg.namespace,
            shards,
            cfg.group,
            cfg.manager,
            cfg.concurrency,
        )

    async def serve(self) -> None:
        """Run the readers and the background loops until stopping."""
        assert self.ks is not None
        groups = (
            [[s] for s in range(self.ks.shards)] if is_cluster_client(self._client) else [list(range(self.ks.shards))]
        )
        self._tasks = [
            asyncio.create_task(
                self._periodic(self.cfg.heartbeat_interval, self._heartbeat, "heartbeat"), name="heartbeat"
            ),
            asyncio.create_task(
                self._periodic(self.cfg.maintenance_interval, self.maintain, "maintenance"), name="maintenance"
            ),
        ]
        readers = [asyncio.create_task(self._reader(g), name=f"reader-{g[0]}") for g in groups]
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
        self._capacity.set()
        pending = [f.task for f in self.in_flight.values() if f.task is not None]
        if pending:
            done, not_done = await asyncio.wait(pending, timeout=self.cfg.shutdown_grace)
            for t in not_done:
                t.cancel()
            await asyncio.gather(*not_done, return_exceptions=True)
        if self.commits is not None:
            await self.commits.drain()
        if self.in_flight and self.broker is not None:
            held = self._held()
            try:
                n = await self.broker.release(held, idle_ms=int(self.cfg.claim_idle * 1000) * 1000)
                logger.warning("worker %s handed back %d unfinished trajectories", self.name, n)
            except Exception:
                logger.exception(
                    "could not hand back in-flight trajectories; they will be reclaimed after claim_idle=%ss",
                    self.cfg.claim_idle,
                )
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.broker is not None:
            try:
                await self.broker.unregister()
            except Exception:
                logger.debug("unregister failed", exc_info=True)
        self.metrics.close()
        if self.manager is not None:
            try:
                await self.manager.close()
                context = getattr(self.manager, "context", None)
                if context is not None:
                    await context.aclose()
            except Exception:
                logger.exception("manager close failed")
            try:
                await self.manager.close_scoring()
            except Exception:
                logger.exception("closing the scorer processes failed")
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None
        self.stopped = True
        logger.info("worker %s stopped: %s", self.name, self.stats)

    # ==================================================================================
    # reading
    # ==================================================================================
    async def _reader(self, shards: list[int]) -> None:
        """Read and handle batches until stopping.

        A batch that fails on a Redis outage (after the connection's own retries, see
        :mod:`rewardq.queue.retry`) is not handled again here: its entries stay pending and are
        reclaimed after ``claim_idle``. The reader pauses by the policy's backoff and reads on.
        """
        assert self.broker is not None
        failures = 0
        while not self._stopping.is_set():
            await self._capacity.wait()
            if self._stopping.is_set():
                break
            try:
                entries = await self.broker.read(shards, self.cfg.batch_size, self.cfg.block_ms or None)
                if entries:
                    await self.handle(entries)
                failures = 0
            except Exception as exc:
                if being_cancelled():
                    raise asyncio.CancelledError from exc
                if _is_nogroup(exc):
                    logger.warning("consumer group vanished; re-creating it")
                    await self.broker.ensure_groups()
                    continue
                if isinstance(exc, NoPermissionError):
                    raise permission_error(exc, self.cfg.namespace, self.cfg.redis_url) from None
                if not is_transient(exc):
                    raise
                failures += 1
                pause = backoff_delay(failures, cap=5.0)
                logger.warning("redis unavailable while reading (%s); reading again in %.2fs", exc, pause)
                await asyncio.sleep(pause)

    # ==================================================================================
    # handling a batch: decode -> reject | store -> start scoring
    # ==================================================================================
    async def handle(self, entries: list[Entry]) -> None:
        """Decode, store and dispatch a batch of entries (from a read or a reclaim)."""
        assert self.broker is not None and self.failures is not None
        self.stats["read"] += len(entries)
        self.metrics.read(len(entries))
        valid = []
        for entry in entries:
            if entry.deliveries > self.cfg.max_deliveries:
                await self.failures.dead_letter(
                    entry,
                    "exhausted",
                    f"delivered {entry.deliveries} times without finishing "
                    f"(max_deliveries={self.cfg.max_deliveries}); the worker scoring it "
                    "probably crashed each time",
                )
                continue
            try:
                rec = decode_output(
                    entry.data,
                    max_bytes=self.cfg.max_record_bytes,
                    vocab_size=self.vocab_size,
                    max_outputs=self.cfg.max_outputs,
                )
                key = entry.key
                if key and key != rec.key:
                    raise RecordError("key", f"stream entry key {key!r} does not match the record's {rec.key!r}")
            except RecordError as exc:
                await self.failures.dead_letter(entry, "invalid", f"invalid record: {exc}")
                continue
            valid.append((entry, rec, bytes(entry.data)))
        valid = await self._claim_whole_trajectories(valid)
        outcomes = await self.broker.store(valid)
        for o in outcomes:
            self.stats["stored"] += 1
            if o.kind == "complete":
                self._start_scoring(o)
            elif o.kind == "parked":
                self.stats["parked"] += 1
            elif o.kind == "conflict":
                await self.failures.dead_letter(o.entry, "conflict", f"conflicting record: {o.detail}", record=o.record)
            elif o.kind == "done":
                self.stats["duplicates"] += 1
            elif o.kind == "leased":
                logger.debug("%s is being scored by %s; leaving entry %s to it", o.record.tid, o.detail, o.entry.id)

    async def _claim_whole_trajectories(self, valid: list) -> list:
        """Start scoring every trajectory whose outputs 0..final all came in this batch.

        One ``claim`` script per trajectory instead of one ``store`` per output (see
        ``lua/claim.lua``). Returns the records that still need :meth:`StreamBroker.store`:
        partial trajectories, redeliveries, and trajectories Redis already knows.
        """
        assert self.broker is not None
        groups: dict[tuple[int, str], list] = {}
        for item in valid:
            entry, rec, _ = item
            groups.setdefault((entry.shard, rec.tid), []).append(item)
        whole, rest = [], []
        for (shard, tid), items in groups.items():
            items.sort(key=lambda it: it[1].index)
            recs = [it[1] for it in items]
            if (
                all(r.index == i for i, r in enumerate(recs))
                and recs[-1].final
                and not any(r.final for r in recs[:-1])
                and all(it[0].deliveries == 1 for it in items)
            ):
                whole.append((shard, tid, items))
            else:
                rest.extend(items)
        if not whole:
            return rest
        claimed = await self.broker.claim_whole([(shard, tid, [it[0] for it in items]) for shard, tid, items in whole])
        for (_shard, _tid, items), ok in zip(whole, claimed):
            if not ok:
                rest.extend(items)
                continue
            self.stats["stored"] += len(items)
            final_entry, final_rec, _ = items[-1]
            self._start_scoring(
                StoreOutcome(
                    "complete",
                    final_entry,
                    final_rec,
                    payloads=[it[2] for it in items],
                    records=[it[1] for it in items],
                )
            )
        return rest

    def _start_scoring(self, o: StoreOutcome) -> None:
        tid = o.record.tid
        if tid in self.in_flight:  # our own redelivery while we score it: the commit will ack it
            return
        flight = InFlight(o.entry.shard, tid, time.time())
        self.in_flight[tid] = flight
        if len(self.in_flight) >= self.cfg.concurrency:
            self._capacity.clear()
        flight.task = asyncio.create_task(self._score_and_commit(o, flight), name=f"score-{tid}")

    async def _score_and_commit(self, o: StoreOutcome, flight: InFlight) -> None:
        assert self.quarantine is not None and self.failures is not None
        shard, tid, gates = o.entry.shard, o.record.tid, self.quarantine.gate
        t0 = time.perf_counter()
        outcome = "ok"
        slot = gate = False
        alone = o.attempts > 1  # an earlier attempt never finished: quarantine
        data_source = str(o.record.sample.get("data_source", ""))
        try:
            await self._slots.acquire()  # held (and its lease renewed) while it waits for a slot
            slot = True
            if alone:
                crashes = await self.quarantine.enter_alone(shard, tid, o.attempts, o.solo)
                gate = True
                if crashes >= self.cfg.max_crashes:
                    outcome = "crashed"
                    await self.failures.fail_trajectory(shard, tid, o.entry, "crashed", crash_reason(crashes))
                    return
            else:
                await gates.enter_shared()
                gate = True
            outcome = await self._score(o, shard, tid)
        except asyncio.CancelledError:
            outcome = "handed-back"
            if alone and gate:
                await self.quarantine.handed_back(shard, tid)
            raise
        except Exception:
            outcome = "commit-failed"
            logger.exception("could not finish %s; its entry stays pending and will be reclaimed", tid)
        finally:
            if gate:
                gates.leave_alone() if alone else gates.leave_shared()
            if slot:
                self._slots.release()
            self._finished(tid, outcome, t0, data_source)

    async def _score(self, o: StoreOutcome, shard: int, tid: str) -> str:
        """Assemble, score and commit one trajectory (or fail it); returns the outcome to log."""
        assert self.scorer is not None and self.failures is not None
        try:
            records = o.records or assemble(
                tid,
                o.payloads,
                max_bytes=self.cfg.max_record_bytes,
                vocab_size=self.vocab_size,
                known=o.record,
                max_outputs=self.cfg.max_outputs,
            )
        except RecordError as exc:
            await self.failures.fail_trajectory(shard, tid, o.entry, "invalid", f"invalid record: {exc}")
            return "invalid"
        try:
            results = await self.scorer.score(records, started_ts=o.entry.ts)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.failures.fail_trajectory(
                shard,
                tid,
                o.entry,
                "scoring",
                f"scoring failed: {type(exc).__name__}: {exc}",
                tb=traceback.format_exc(),
            )
            return "error"
        await self._commit(shard, tid, results)
        self.stats["scored"] += 1
        if results and results[-1].latency_ms is not None:
            self._recent.append((time.time(), results[-1].latency_ms))
        return "ok"

    def _finished(self, tid: str, outcome: str, t0: float, data_source: str) -> None:
        if outcome != "handed-back":
            self.in_flight.pop(tid, None)
        if len(self.in_flight) < self.cfg.concurrency:
            self._capacity.set()
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

    async def _commit(self, shard: int, tid: str, results: list) -> None:
        """Write back, then ack (one atomic script, sent with the other commits of this loop
        turn). The connection's retry policy rides out a short outage (:mod:`rewardq.queue.retry`);
        a commit that still fails leaves the entries pending, to be reclaimed and scored again."""
        assert self.commits is not None
        await self.commits.commit(shard, tid, results)

    # ==================================================================================
    # background: heartbeat + lease renewal, maintenance
    # ==================================================================================
    def _held(self) -> dict[int, list[str]]:
        held: dict[int, list[str]] = {}
        for f in self.in_flight.values():
            held.setdefault(f.shard, []).append(f.tid)
        return held

    def _code_stats(self) -> Any:
        """The manager's code-execution counters (None for a manager without a context)."""
        return getattr(getattr(self.manager, "context", None), "code_stats", None)

    def snapshot(self) -> dict[str, Any]:
        now = time.time()
        recent = [lat for t, lat in self._recent if now - t <= 60]
        window = [t for t, _ in self._recent if now - t <= 10]
        code = self._code_stats()
        return {
            **({"code": json.dumps(code.snapshot())} if code is not None and code.sources else {}),
            **self.stats,
            "in_flight": len(self.in_flight),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "manager": self.cfg.manager,
            "started_at": f"{self._started_at:.3f}",
            "rate": round(len(window) / 10.0, 3),
            "latency_p50_ms": round(sorted(recent)[len(recent) // 2], 3) if recent else "",
            "in_flight_tids": ",".join(list(self.in_flight)[:20]),
        }

    async def _beat(self) -> None:
        assert self.broker is not None
        await self.broker.heartbeat(self.snapshot(), ttl=max(3 * self.cfg.heartbeat_interval, 5))

    async def _periodic(self, interval: float, step: Any, what: str) -> None:
        """Run ``step()`` every ``interval`` seconds; log its failures, never swallow a cancellation."""
        while True:
            await asyncio.sleep(interval)
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if being_cancelled():
                    raise asyncio.CancelledError from exc
                logger.warning("%s failed: %s", what, exc)
            if being_cancelled():  # a client call swallowed our cancellation: honour it anyway
                raise asyncio.CancelledError

    async def _heartbeat(self) -> None:
        """Publish liveness and counters, and renew the leases of in-flight trajectories."""
        assert self.broker is not None
        await self._beat()
        if self.in_flight:
            await self.broker.renew(self._held())
        self.metrics.in_flight(len(self.in_flight))

    async def maintain(self) -> None:
        """Reclaim idle entries of dead workers and end trajectories that waited too long."""
        assert self.broker is not None and self.ks is not None
        for shard in range(self.ks.shards):
            if self._stopping.is_set():
                return
            if self._capacity.is_set():
                claimed = await self.broker.reclaim(shard, int(self.cfg.claim_idle * 1000), self.cfg.batch_size)
                if claimed:
                    self.stats["reclaimed"] += len(claimed)
                    self.metrics.reclaimed(len(claimed))
                    logger.info("reclaimed %d idle entries on shard %d", len(claimed), shard)
                    await self.handle(claimed)
            for tid, reason in await self.broker.expire_incomplete(shard):
                self.stats["expired"] += 1
                self.stats["errors"] += 1
                self.metrics.dead_letter("incomplete")
                logger.warning("trajectory %s ended: %s", tid, reason)


def _is_nogroup(exc: BaseException) -> bool:
    """The group or stream vanished (deleted by an operator, or a Redis without persistence restarted)."""
    text = str(exc)
    return "NOGROUP" in text or "UNBLOCKED" in text
