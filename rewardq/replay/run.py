"""``rewardq replay``'s run: a worker in this process scores a ledger's trajectories into a new ledger.

The orchestration of :mod:`rewardq.ledger.replay` (which rebuilds the trajectories): see its module
doc for the steps. This part needs the worker (:mod:`rewardq.consumers`) and, without
``--redis-url``, the embedded Redis stand-in (:mod:`rewardq.demo.embedded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError, RecordError, ReplayStopped
from rewardq.ledger.replay import Plan, Trajectory
from rewardq.queue.keys import Keyspace, output_key
from rewardq.reward.judge.cache import seed_answers

if TYPE_CHECKING:
    from rewardq.config import WorkerConfig
    from rewardq.consumers.compose import PreparedWorker
    from rewardq.reward.scoring_fingerprint import ScoringFingerprint

logger = logging.getLogger("rewardq.replay")

#: Seconds between two reads of the results of the trajectories in flight.
_POLL = 0.05


@dataclass
class Outcome:
    """How a replay ended."""

    scored: int = 0
    errors: int = 0
    refused: int = 0  # trajectories the producer refused to send (rows no record can be made of)
    interrupted: bool = False
    stopped_by: str | None = None  # why it was interrupted: a signal's name, or a ReplayStopped's message
    namespace: str = ""


@contextlib.contextmanager
def redis_for(cfg: WorkerConfig, given_url: bool) -> Iterator[str]:
    """The Redis a replay runs on: the given one, or an embedded stand-in for the run."""
    if given_url:
        yield cfg.redis_url
        return
    try:
        from rewardq.demo.embedded import EmbeddedRedis
    except ImportError:  # pragma: no cover - the demo module is part of rewardq
        raise
    try:
        import fakeredis  # noqa: F401 - the stand-in's engine
    except ImportError:
        raise ConfigError(
            "rewardq replay without --redis-url runs on an embedded Redis stand-in, which needs fakeredis: "
            "pip install 'rewardq[demo]', or give --redis-url (a Redis of your own; the replay uses a "
            "namespace of its own there)"
        ) from None
    with EmbeddedRedis() as server:
        yield server.url


async def run_replay(
    prepared: PreparedWorker,
    trajectories: Sequence[Trajectory],
    *,
    window: int,
    timeout: float,
    progress: Any = None,
    interrupt: asyncio.Event | None = None,
) -> Outcome:
    """Score ``trajectories`` with the worker ``prepared`` (its ``ledger`` the output; see the
    module doc); ``progress``: called with the number of trajectories finished so far; ``interrupt``:
    set to stop sending (the worker then finishes and writes what it holds).

    Once the sending stopped (every trajectory scored, or ``interrupt`` set), the worker's stop is
    never cancelled: it writes the output ledger whatever comes next (a second Ctrl-C).

    Results are polled (one read of every in-flight key per round, every ``_POLL`` s) rather than
    awaited on the ``done`` stream, whose blocking reads the embedded stand-in serves by timeout.
    """
    from rewardq.consumers.compose import run_worker
    from rewardq.producers.aio import AsyncRewardClient

    cfg = prepared.cfg
    stop = asyncio.Event()
    task = asyncio.create_task(run_worker(prepared, stopping=stop), name="replay-worker")
    client = AsyncRewardClient.from_url(cfg.redis_url, namespace=cfg.namespace, max_backlog=None)
    outcome = Outcome(namespace=cfg.namespace)
    flying: dict[str, tuple[list[str], float]] = {}  # tid -> (keys, deadline)
    sending = asyncio.create_task(_send(cfg, client, task, trajectories, flying, outcome, window, timeout, progress))
    stopped = asyncio.create_task((interrupt or asyncio.Event()).wait())
    try:
        await asyncio.wait({sending, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not sending.done():
            outcome.interrupted = True
            sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending  # its error, if it failed
    except ReplayStopped as exc:  # the sending gave up: the worker still writes what it holds
        outcome.interrupted, outcome.stopped_by = True, str(exc)
    finally:
        stopped.cancel()
        sending.cancel()  # a no-op once it ended; else (this call cancelled) it must not outlive it
        stop.set()  # the worker finishes what it holds, then stops
        with contextlib.suppress(Exception):
            await task
        if outcome.interrupted and flying:
            # the worker scored (and wrote to --out) what it held when it stopped: count it
            with contextlib.suppress(Exception):
                await _collect(client, flying, outcome, progress, None)
        await client.aclose()
    return outcome


async def _send(
    cfg: WorkerConfig,
    client: Any,
    worker: asyncio.Task[None],
    trajectories: Sequence[Trajectory],
    flying: dict[str, tuple[list[str], float]],
    outcome: Outcome,
    window: int,
    timeout: float,
    progress: Any,
) -> None:
    """Put the judge's answers back, then send ``trajectories`` (at most ``window`` in flight) and
    count their results until every one has its own."""
    loop = asyncio.get_running_loop()
    pending = list(reversed(trajectories))
    answers = {d: a for t in trajectories for d, a in t.judged.items()}
    await seed_answers(cfg.redis_url, Keyspace(cfg.namespace), answers, cfg.result_ttl)
    while pending or flying:
        if worker.done():  # the worker stopped before the replay finished: say why
            worker.result()
            raise ReplayStopped("the replay's worker stopped before every trajectory was scored (see its log)")
        while pending and len(flying) < window:
            t = pending.pop()
            # in flight before the put: a stop during it may still have sent every output, which the
            # worker then scores into --out; the last look counts it when every key has a result
            keys = [output_key(t.uid, t.session_id, i) for i in range(len(t.outputs))]
            tid = f"{t.uid}_{t.session_id}"
            flying[tid] = (keys, loop.time() + timeout)
            try:
                await client.put_trajectory(t.uid, t.session_id, t.outputs, t.sample)
            except RecordError as exc:  # checked before anything is sent: this trajectory only
                del flying[tid]
                outcome.refused += 1
                logger.warning("replay: trajectory %s cannot be sent again, its rows make no record: %s", tid, exc)
        await asyncio.sleep(_POLL)
        await _collect(client, flying, outcome, progress, loop.time(), timeout)


async def _collect(
    client: Any,
    flying: dict[str, tuple[list[str], float]],
    outcome: Outcome,
    progress: Any,
    now: float | None,
    timeout: float = 0.0,
) -> None:
    """Count the trajectories of ``flying`` whose every key has a result (and forget them); raise
    ReplayStopped for one past its deadline (``now`` None: a last look, no deadline)."""
    results = await client.get_rewards([k for keys, _ in flying.values() for k in keys])
    for tid, (keys, deadline) in list(flying.items()):
        got = [results.get(k) for k in keys]
        if all(r is not None for r in got):
            del flying[tid]
            outcome.scored += 1
            outcome.errors += any(r is not None and not r.ok for r in got)
            if progress is not None:
                progress(outcome.scored)
        elif now is not None and now > deadline:
            raise ReplayStopped(
                f"trajectory {tid} got no result within --timeout {timeout:g} s of being sent; its clock "
                f"includes its wait behind the {len(flying) - 1} other trajectories in flight, so the slow "
                "one may be another: raise --timeout, or look for a scorer, judge or sandbox that hangs"
            )


def flag_given(cfg: WorkerConfig, name: str) -> bool:
    """Whether setting ``name`` came from a command-line flag (not a default, the environment or a
    config file: a fleet's own ``REWARDQ_NAMESPACE`` or config file must not choose a replay's)."""
    source = cfg.sources.get(name, "default")
    if name == "redis_url" and source.startswith("redis_url_file"):
        return flag_given(cfg, "redis_url_file")
    return source.startswith("flag")


def replay_config(cfg: WorkerConfig, out: str, *, given_url: bool, url: str) -> WorkerConfig:
    """The worker settings of a replay: ``cfg`` writing the ledger ``out``, on ``url``, in a namespace
    of its own unless ``--namespace`` was given (:func:`flag_given`), spooling in ``out``'s own spool
    folder unless ``--ledger-spool`` was given: a fleet's spool folder (from its environment or
    config file) would let the replay's worker adopt the fleet's dead workers' segments into ``out``,
    and the fleet adopt the replay's."""
    namespace = cfg.namespace if flag_given(cfg, "namespace") else None
    return dataclasses.replace(
        cfg,
        redis_url=url,
        namespace=namespace or f"{OWN_NAMESPACE}{secrets.token_hex(4)}",
        name=cfg.name or f"replay-{secrets.token_hex(3)}",
        ledger=out,
        ledger_spool=cfg.ledger_spool if flag_given(cfg, "ledger_spool") else None,
        cluster=cfg.cluster if given_url else False,
    ).validate()


#: The prefix of the namespace a replay makes for itself (and deletes at its end).
OWN_NAMESPACE = "rewardq-replay-"


def check_resume(out: str, mine: ScoringFingerprint) -> str:
    """Refuse (ConfigError) to add to output ledger ``out`` rows of another scoring configuration than
    the one it holds (:data:`~rewardq.ledger.replay.RECORD`, else its rows' ``scoring``); returns
    ``out``'s id: the one its record holds, else a new one (:func:`record_scoring` writes it)."""
    from rewardq.ledger import replay as rp
    from rewardq.reward.scoring_fingerprint import differences

    recorded = rp.read_record(out)
    if recorded is not None and recorded.get("scoring") != mine.digest:
        said = differences(dict(recorded.get("shown") or {}), mine.shown)
        raise ConfigError(
            f"--out {out} holds a replay scored with another configuration: {recorded.get('text')} "
            f"(fingerprint {recorded.get('scoring')}); this replay's is {mine.text} (fingerprint {mine.digest})"
            f"{'; ' + said if said else ''}. Replay into a new --out to score with this configuration, or run "
            "with the first one's flags to go on with it"
        )
    if recorded is None:
        others = sorted(rp.scorings_in(out) - {mine.digest})
        if others:
            raise ConfigError(
                f"--out {out} holds rows scored with another configuration (fingerprint {', '.join(others)}); "
                f"this replay's is {mine.text} (fingerprint {mine.digest}). Replay into a new --out"
            )
    return str((recorded or {}).get("id") or secrets.token_hex(8))


def record_scoring(out: str, source: str, mine: ScoringFingerprint, out_id: str) -> None:
    """Record in output ledger ``out`` the scoring configuration ``mine`` that writes it and ``out``'s
    id ``out_id`` (made if missing), for :func:`check_resume` to hold a later replay into it to, and
    for :mod:`rewardq.replay.namespace` to tell its namespace by."""
    from rewardq.ledger import replay as rp

    record = {"source": source, "scoring": mine.digest, "text": mine.text, "shown": mine.shown, "id": out_id}
    rp.write_record(out, record)


def drop_spool_folder(cfg: WorkerConfig) -> None:
    """After the replay's worker stopped: remove its ``--out`` spool folder if that left it empty.
    Its lock files are the spool's own business: the worker's clean stop deleted its own, and its
    adoption of any dead worker's segments the dead worker's (:mod:`rewardq.ledger.spool`); a
    folder still holding segments or a lock (another replay into the same ``--out`` on this host)
    stays for the next worker."""
    from rewardq.ledger.store import default_spool

    directory = Path(cfg.ledger_spool or default_spool(cfg.ledger or ""))
    with contextlib.suppress(OSError):
        directory.rmdir()  # only when empty
        if directory.parent.name == "_spool":  # <ledger>/_spool/<host>: the ledger's own spool folder
            directory.parent.rmdir()


def summary_json(p: Plan, o: Outcome, source: str, out: str) -> str:
    return json.dumps(
        {
            "source": source,
            "out": out,
            "selected": p.selected,
            "replayed": o.scored,
            "with_errors": o.errors,
            "refused": o.refused,
            "already_in_out": p.done_before,
            "incomplete": p.incomplete,
            "rows_missing": p.rows_missing,
            "unreadable": p.unreadable,
            "over_limit": p.over_limit,
            "interrupted": o.interrupted,
            "stopped_by": o.stopped_by,
            "namespace": o.namespace,
        }
    )
