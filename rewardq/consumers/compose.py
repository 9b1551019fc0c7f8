"""The composition root: the one place a reward worker is put together.

Every way of starting a worker comes through here, so none can drift from another: ``rewardq
worker`` (and through it the demo's worker processes and the Ray fleet's actors, which run that
command), the benchmarks and the test helpers. Two steps, then the worker's life:

1. :func:`prepare_worker` (synchronous; touches no Redis): names the worker, refuses what can be
   refused before torch is imported (an unknown ``--manager``, no ``--tokenizer``, a tokenizer path
   that is not there), imports torch, loads the tokenizer, builds the worker's one
   :class:`~rewardq.reward.context.ManagerContext` from its settings (Redis, namespace, name, cluster,
   ``result_ttl``, where scoring functions run, how code runs) and the manager in it. A bad manager
   or tokenizer raises :class:`~rewardq.errors.ConfigError` here: ``rewardq worker`` exits 2 before
   it waits for Redis.
2. :func:`open_worker` (async): connects (unless given a client), checks the Redis user's
   permissions, agrees on the shards and creates the groups (:func:`open_broker`), refuses a
   namespace a ``rewardq replay`` holds unless it is that replay's own worker
   (:func:`refuse_replays_namespace`, before it writes anything, and again once the namespace's
   meta exists), holds to the namespace's scoring configuration
   (:class:`~rewardq.consumers.scoring_gate.ScoringGate`), sets the manager up and starts its
   scorer processes, serves the metrics, builds the collaborators and beats the heart once. It
   returns a :class:`~rewardq.consumers.worker.Worker` that holds every part, or None when a stop
   was asked for while it waited to take over; what it opened is closed when it fails.
3. :func:`run_worker`: 2 then the worker's :meth:`~rewardq.consumers.worker.Worker.run` (serve
   until stopped, then stop), as the process's owner when ``own_process`` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rewardq import __version__
from rewardq.config import WorkerConfig
from rewardq.consumers.accounting import Accounting, open_ledger
from rewardq.consumers.assembly import RecordDecoder
from rewardq.consumers.commits import CommitCoalescer
from rewardq.consumers.failures import FailureHandler
from rewardq.consumers.inflight import InFlightTable
from rewardq.consumers.metrics import Metrics, NoMetrics
from rewardq.consumers.presence import COUNTERS, Presence
from rewardq.consumers.process import EarlySignals, StopSignals, exit_after, limit_torch_threads
from rewardq.consumers.quarantine import Quarantine
from rewardq.consumers.resources import close_manager, open_broker, serve_metrics
from rewardq.consumers.retries import Retries, RoomWaits
from rewardq.consumers.scoring_gate import ScoringGate
from rewardq.errors import ConfigError
from rewardq.exit_codes import exit_code_of
from rewardq.ledger.store import check_places
from rewardq.logs import startup_step
from rewardq.queue.connection import connect_async, refusals_named
from rewardq.queue.keys import Keyspace
from rewardq.queue.meta import default_worker_name
from rewardq.queue.namespace import ReplayMark, read_replay_mark
from rewardq.queue.provenance import publish as publish_provenance
from rewardq.reward.context import ManagerContext
from rewardq.reward.execution.settings import ScoringSettings, reply_bytes_for
from rewardq.reward.provenance import ProvenanceBook
from rewardq.reward.registry import check_manager_spec, is_builtin_manager
from rewardq.reward.scoring_fingerprint import scoring_fingerprint, shown_settings
from rewardq.reward.tokenizer import check_tokenizer_spec
from rewardq.reward.tokenizer_fingerprint import tokenizer_fingerprint

if TYPE_CHECKING:
    from rewardq.consumers.worker import Worker
    from rewardq.queue.clients import AsyncRedis
    from rewardq.reward.base import RewardManager
    from rewardq.reward.tokenizer import Tokenizer


#: Seconds after ``shutdown_grace`` at which a stopping worker process exits even if threads
#: or children it cannot stop still run (SIGTERM ends the process within grace + 5 s).
EXIT_AFTER_GRACE = 4.0
#: Seconds a worker process that has stopped (everything handed back) may take to exit before
#: it exits anyway: a hung thread in asyncio's default executor would otherwise hold it forever.
#: A busy 2-core machine (load ~10) took over 2 s to end the event loop and report an error.
EXIT_AFTER_STOP = 5.0

logger = logging.getLogger("rewardq.worker")

__all__ = [
    "PreparedWorker",
    "build_from_config",
    "open_worker",
    "prepare_worker",
    "refuse_replays_namespace",
    "run_worker",
]


@dataclass(frozen=True)
class PreparedWorker:
    """What :func:`prepare_worker` built: the settings, the worker's name, the tokenizer, and the
    manager with its context; ``replay``: the mark of the ``rewardq replay`` whose own worker this
    is (that command sets it), the one replay mark its namespace may carry."""

    cfg: WorkerConfig
    name: str
    tokenizer: Tokenizer | None
    manager: RewardManager
    replay: ReplayMark | None = None

    @property
    def context(self) -> ManagerContext:
        return self.manager.context


def prepare_worker(
    cfg: WorkerConfig,
    *,
    manager: RewardManager | None = None,
    tokenizer: Tokenizer | None = None,
    standalone: bool = False,
) -> PreparedWorker:
    """Step 1 (see the module doc): the tokenizer, the context and the manager ``cfg`` names.

    Args:
        manager: (tests, embedding) a manager built by the caller, used as it is, with the
            ``tokenizer`` given (None: the worker bounds no token ids by a vocabulary).
        standalone: the manager scores outside any worker (:mod:`rewardq.testing`): its context
            names no Redis, so what a fleet would share stays in the process, and nothing is logged
            but the start-up steps.

    Raises:
        ConfigError: naming what to fix.
    """
    name = cfg.name or default_worker_name()
    if manager is not None:  # the caller's own (tests, embedding): nothing to check, build or log
        return PreparedWorker(cfg, name, tokenizer, manager)
    return build_from_config(cfg, name, standalone=standalone)


def build_from_config(cfg: WorkerConfig, name: str, *, standalone: bool = False) -> PreparedWorker:
    """The tokenizer, the one :class:`ManagerContext` of worker ``name`` (every field from its
    settings; ``standalone``: no Redis) and the manager in it, as ``cfg`` describes them.

    The settings are read first, then handed down to the reward layer's checks and constructors,
    which never reach back up here.
    """
    secret_files = cfg.secret_files()
    scoring = ScoringSettings(  # where the manager's scoring functions run
        reward_fn=cfg.reward_fn or None,
        reward_fn_kwargs=dict(cfg.reward_fn_kwargs or {}),
        reward_fn_placement=cfg.reward_fn_placement,
        processes=cfg.scorer_processes,
        max_spares=cfg.scorer_spares,
        reply_bytes=reply_bytes_for(cfg.max_result_bytes),
    )
    source = cfg.sources.get("tokenizer", "")
    origin = source if source.startswith("file ") else None
    # before torch: these need no import and fail in a moment (a --reward-fn may register the manager)
    check_manager_spec(cfg.manager, names_may_register=bool(cfg.reward_fn))
    check_tokenizer_spec(cfg.tokenizer, origin=origin)
    if cfg.ledger and not standalone:  # its folders, before anything connects or writes
        check_places(cfg.ledger, cfg.ledger_spool)
    with startup_step(logger, "importing torch, tensordict and the reward managers"):
        from rewardq.reward.tensordict_import import import_tensordict

        import_tensordict()  # torch and tensordict, without torch's compiler: most of a start-up

        # the managers import torch: imported in this timed step, after the refusals that need none
        from rewardq.reward.execution.loader import load_score_fn
        from rewardq.reward.factory import accepted_options, build_manager
        from rewardq.reward.registry import get_manager_class
        from rewardq.reward.tokenizer import load_tokenizer
    with startup_step(logger, f"loading the tokenizer ({cfg.tokenizer})"):
        tokenizer = load_tokenizer(cfg.tokenizer, origin=origin)
    context = ManagerContext(
        redis_url=None if standalone else cfg.redis_url,
        namespace=cfg.namespace,
        worker_name=name,
        cluster=cfg.cluster,
        result_ttl=cfg.result_ttl,
        scoring=scoring,
        secret_files=secret_files,
    )
    with startup_step(logger, f"building the {cfg.manager} manager"):
        score_fn = load_score_fn(cfg.reward_fn, cfg.reward_fn_kwargs) if cfg.reward_fn else None
        options = dict(cfg.manager_options)
        if cfg.reward_fn and "scorer_spec" in accepted_options(get_manager_class(cfg.manager))[0]:
            options.setdefault("scorer_spec", cfg.reward_fn)  # process-isolated managers re-load it in the child
        built = build_manager(
            cfg.manager, tokenizer=tokenizer, compute_score=score_fn, options=options, context=context
        )
    if not standalone:
        context.code_runtime().announce()  # the rlimits warning, the start-up probe, or why code is refused
        shown = shown_settings(cfg)  # once everything they name was found and built
        logger.info(
            "effective config: %s",
            json.dumps(shown, sort_keys=True, default=str),
            extra={"config": shown, "sources": dict(cfg.sources)},
        )
        if cfg.unused_keys:
            logger.warning(
                "config file: rewardq does not use %d key(s), ignoring them: %s",
                len(cfg.unused_keys),
                ", ".join(cfg.unused_keys),
            )
    return PreparedWorker(cfg, name, tokenizer, built)


async def open_worker(
    prepared: PreparedWorker,
    *,
    client: AsyncRedis | None = None,
    metrics: Metrics | None = None,
    stopping: asyncio.Event | None = None,
) -> Worker | None:
    """Step 2 (see the module doc): a started :class:`~rewardq.consumers.worker.Worker`, or None
    when ``stopping`` was set while it waited to take over the namespace.

    Args:
        client: an existing ``redis.asyncio`` client (tests, the embedded demo), left open at the
            worker's stop; default: connect to ``redis_url``, closed at the stop.
        metrics: the metrics hooks (tests); default: served on ``metrics_port`` if set, else none.
        stopping: set to stop the worker (the signals of :func:`run_worker` set it).
    """
    # these import torch (the batch): here, so that step 1 refuses what it can before torch is imported
    from rewardq.consumers.parts import WorkerParts
    from rewardq.consumers.scorer import TrajectoryScorer
    from rewardq.consumers.worker import Worker

    cfg, name, manager = prepared.cfg, prepared.name, prepared.manager
    limit_torch_threads()
    stopping = stopping or asyncio.Event()
    own = client is None
    r = client or connect_async(cfg.redis_url, cluster=cfg.cluster, scripts_once=True)
    opened = False
    try:
        with refusals_named(cfg.namespace, cfg.redis_url):  # before open_broker's check of the user's rights
            await refuse_replays_namespace(r, Keyspace(cfg.namespace), prepared.replay, cluster=cfg.cluster)
        broker = await open_broker(r, cfg, name)
        # read again once <ns>:meta exists: a replay that marks the namespace after the first read
        # finds the meta when it checks the namespace again after its mark, and refuses itself
        await refuse_replays_namespace(r, broker.ks, prepared.replay, cluster=cfg.cluster)
        fingerprint = tokenizer_fingerprint(prepared.tokenizer)
        mine = scoring_fingerprint(cfg, fingerprint)
        gate = ScoringGate(r, broker.ks, mine, takeover=cfg.takeover, stopping=stopping.is_set)
        with startup_step(logger, "agreeing on the namespace's scoring configuration"):
            if not await gate.join():
                return None
        with startup_step(logger, f"setting up the {cfg.manager} manager"):
            await manager.setup()
        with startup_step(logger, "starting the scorer processes"):
            await manager.prepare_scoring()
        port: int | None = None
        if metrics is None and cfg.metrics_port is not None:
            metrics, port = serve_metrics(cfg, manager, cfg.metrics_port, r, broker.ks)
        metrics = metrics or NoMetrics()
        stats = dict.fromkeys(COUNTERS, 0)
        flights = InFlightTable(cfg.concurrency, read_ahead=cfg.read_ahead)
        presence = Presence(manager_name=cfg.manager, stats=stats, in_flight=flights.by_tid)
        presence.scoring = mine.digest
        accounting = _accounts(cfg, name, manager, r, broker.ks, mine.digest, metrics)
        room = RoomWaits(metrics=metrics, stats=stats)  # writes refused past maxmemory, waited out
        decoder = record_decoder(cfg, prepared.tokenizer, fingerprint)
        parts = WorkerParts(
            cfg=cfg,
            name=name,
            client=r,
            owns_client=own,
            broker=broker,
            manager=manager,
            tokenizer=prepared.tokenizer,
            tokenizer_fingerprint=fingerprint,
            decoder=decoder,
            gate=gate,
            metrics=metrics,
            metrics_port=port,
            stopping=stopping,
            stats=stats,
            flights=flights,
            presence=presence,
            failures=FailureHandler(
                broker,
                worker_name=name,
                max_record_bytes=cfg.max_record_bytes,
                stats=stats,
                metrics=metrics,
                presence=presence,
                accounting=accounting,
                room=room,
                decode=decoder,
            ),
            retries=Retries(broker.attempts, retry_for=cfg.retry_for, stopping=stopping, metrics=metrics, stats=stats),
            scorer=TrajectoryScorer(
                manager,
                manager_name=cfg.manager,
                worker_name=name,
                timeout=cfg.score_timeout,
                max_result_bytes=cfg.max_result_bytes,
                stopping=stopping.is_set,
            ),
            commits=CommitCoalescer(broker, room, patience=cfg.room_wait),
            quarantine=Quarantine(broker.attempts),
            accounting=accounting,
        )
        worker = Worker(parts)
        await worker.beat()
        worker.announce()
        opened = True
        return worker
    finally:
        if not opened:  # failed, or stopped at the gate: close what was opened, in the worker's order
            if metrics is not None:
                metrics.close()
            await close_manager(manager)
            if own:
                await r.aclose()


async def refuse_replays_namespace(
    client: AsyncRedis, ks: Keyspace, own: ReplayMark | None, *, cluster: bool = False
) -> None:
    """Refuse (ConfigError) a namespace that carries the mark of a ``rewardq replay``
    (:mod:`rewardq.replay.namespace`) unless it is ``own``, the mark of the replay whose own worker
    this is (:attr:`PreparedWorker.replay`): another worker would score the replay's trajectories
    into its own ledger, not the replay's ``--out``. ``cluster``: the fix names ``redis-cli -c``."""
    found = await read_replay_mark(client, ks)
    if found is None or found == own:
        return
    out = f"--out {found.path}" if found.path else f"the --out whose replay record has id {found.out}"
    redis_cli = "redis-cli -c" if cluster else "redis-cli"
    raise ConfigError(
        f"namespace {ks.namespace!r} is held by `rewardq replay` into {out} ({ks.replay} = {found.encode()}): "
        "a worker started there would score the replay's trajectories into its own ledger instead of the "
        "replay's --out. Give this worker (and its producers) another --namespace; or, if that replay is over "
        f"(no `rewardq replay` runs there, and none will go on there), delete its mark: {redis_cli} DEL {ks.replay}"
    )


def record_decoder(cfg: WorkerConfig, tokenizer: object, fingerprint: str | None) -> RecordDecoder:
    """The worker's decoder: its record bounds, and its tokenizer's vocabulary size (None:
    unchecked) and fingerprint. The size is read here once: the tokenizer does not change in a
    worker's life, and ``tokenizers`` 0.22 (verl 0.9.1's environment) counts a 128k vocabulary in
    ~120 ms per call (``get_vocab_size(with_added_tokens=True)``)."""
    vocab_size: int | None = getattr(tokenizer, "vocab_size", None)
    return RecordDecoder(
        max_bytes=cfg.max_record_bytes,
        vocab_size=vocab_size,
        max_outputs=cfg.max_outputs,
        max_image_bytes=cfg.max_image_bytes,
        tokenizer=fingerprint,
    )


def _accounts(
    cfg: WorkerConfig,
    name: str,
    manager: RewardManager,
    client: AsyncRedis,
    ks: Keyspace,
    scoring: str,
    metrics: Metrics,
) -> Accounting:
    """The provenance book and, with ``ledger`` set, the ledger (:mod:`rewardq.consumers.accounting`)."""
    book = ProvenanceBook(
        manager,
        manager_spec=cfg.manager,
        scoring=scoring,
        reward_fn=cfg.reward_fn,
        custom=not is_builtin_manager(cfg.manager),
        version=__version__,
    )

    async def publish(digest: str, blob: str) -> None:
        await publish_provenance(client, ks, digest, blob)

    with startup_step(logger, "opening the ledger") if cfg.ledger else contextlib.nullcontext():
        ledger = open_ledger(cfg, name)
    accounting = Accounting(book, publish, ledger)
    metrics.watch_health(accounting.health.windows)
    if ledger is not None:
        metrics.watch_ledger(ledger.snapshot)
    return accounting


async def run_worker(
    prepared: PreparedWorker,
    *,
    client: AsyncRedis | None = None,
    metrics: Metrics | None = None,
    own_process: bool = False,
    early: EarlySignals | None = None,
    on_open: Callable[[Worker], None] | None = None,
    stopping: asyncio.Event | None = None,
) -> None:
    """Step 2, then serve until stopped, then stop (the whole life of a worker).

    Args:
        client, metrics: as :func:`open_worker`.
        own_process: this process is the worker's own (``rewardq worker``, a test's worker
            process): SIGTERM/SIGINT stop it, with a deadline that always holds
            (:class:`~rewardq.consumers.process.StopSignals`), the start-up heap is frozen, and
            threads left behind cannot hold the exit once it stopped.
        early: the signals caught before this ran; one received stops the worker at once.
        on_open: called with the worker once it is open, before it serves (the fault hooks of
            tests/support/proc_worker.py).
        stopping: set it to stop the worker, whether it is still starting or already serving.

    Raises:
        ScoringConflict: the worker stopped because another scoring configuration took over.
    """
    stopping = stopping or asyncio.Event()
    opened: list[Worker] = []
    failure: list[BaseException] = []
    clean = False

    def request_stop(why: str) -> None:
        if opened:
            opened[0].request_stop(why)
        elif not stopping.is_set():
            logger.info("received %s during start-up; stopping", why)
            stopping.set()

    def exit_code() -> int:  # for a forced exit: the code the command ends with when it exits itself
        if failure:
            return exit_code_of(failure[0])
        return 0 if clean and (not opened or opened[0].stopped) else 1

    if own_process:
        deadline = prepared.cfg.shutdown_grace + EXIT_AFTER_GRACE
        StopSignals(asyncio.get_running_loop(), request_stop, deadline=deadline, exit_code=exit_code).install()
        if early is not None and early.received:
            request_stop(early.received)
    try:
        worker = await open_worker(prepared, client=client, metrics=metrics, stopping=stopping)
        if worker is not None:
            opened.append(worker)
            if on_open is not None:
                on_open(worker)
            await worker.run(freeze_heap=own_process)
        clean = True
    except BaseException as exc:  # a superseded worker exits 2 even when its exit is forced
        failure.append(exc)
        raise
    finally:
        if own_process:  # nothing left to wait for: leftover threads must not hold the exit
            why = f"worker {prepared.name} stopped"
            if failure:  # said here too: a forced exit can come before the command reports it
                why += (
                    f" ({type(failure[0]).__name__}: {failure[0]})"
                    if str(failure[0])
                    else f" ({type(failure[0]).__name__})"
                )
            exit_after(EXIT_AFTER_STOP, exit_code, why=why)
