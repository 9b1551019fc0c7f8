"""Every reward accountable: a worker's provenance book and its ledger, around each commit.

:class:`Accounting` is a collaborator of :class:`~rewardq.consumers.worker.Worker`, like the
commit coalescer. For each trajectory it

1. names what will produce the result (:meth:`provenance_of`: one interned blob per scorer,
   :mod:`rewardq.reward.provenance`), so the scorer writes its digest into every result;
2. before the commit (:meth:`before_commit`): writes a blob Redis has not seen yet to
   ``<ns>:provenance`` (once per blob and worker), then spools the trajectory to the ledger when
   one is configured (:mod:`rewardq.ledger`), so nothing acknowledged is missing from it;
3. after the commit (:meth:`settle`): tells the ledger whether the commit wrote the result.

Each trajectory also counts in the worker's live reward health (:mod:`rewardq.consumers.reward_health`).

Failures take the same path (:meth:`before_failure`). Without a ledger, only steps 1 and 2's
Redis write remain: provenance costs a dict lookup per trajectory and one ``HSETNX`` per blob.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rewardq.consumers.assembly import trajectory_sample
from rewardq.consumers.failure_rows import FailureRows
from rewardq.consumers.reward_health import RewardHealth
from rewardq.ledger.checks import INT32_MAX
from rewardq.ledger.frames import TrajectoryFacts, stub_record
from rewardq.queue.codec import OutputRecord, decode_output
from rewardq.queue.endings import Expired
from rewardq.queue.entries import StoreOutcome
from rewardq.queue.results import RESULT_FIELDS, EncodedResults
from rewardq.queue.states import FailureKind
from rewardq.reward.provenance import Provenance, ProvenanceBook
from rewardq.reward.trace import ScoringTrace

if TYPE_CHECKING:
    from rewardq.ledger.sink import Ledger

logger = logging.getLogger("rewardq.worker")

Publish = Callable[[str, str], Awaitable[None]]
#: Bytes of records the expire script returns per call when the worker keeps a ledger (the first
#: ended trajectory's always, whatever their size; the others past it wait for the next pass).
EXPIRED_RECORDS_BYTES = 32 * 1024 * 1024


class Accounting:
    """Provenance and ledger for one worker (see the module doc).

    Args:
        book: the worker's provenance book.
        publish: writes one blob to Redis (``digest, JSON``).
        ledger: the ledger writer, or None when ``ledger`` is not set.
    """

    def __init__(self, book: ProvenanceBook, publish: Publish, ledger: Ledger | None) -> None:
        self.book = book
        self.publish = publish
        self.ledger = ledger
        self.health = RewardHealth()  # live reward health per data source (rewardq.consumers.reward_health)

    def provenance_of(self, sample: dict[str, object]) -> Provenance:
        return self.book.of(sample.get("data_source"))

    async def publish_once(self, prov: Provenance) -> None:
        """Publish ``prov`` to Redis unless this worker already did (results and rows name its digest)."""
        if prov.digest not in self.book.published:
            await self.publish(prov.digest, prov.json)
            self.book.published.add(prov.digest)

    async def before_commit(
        self,
        o: StoreOutcome,
        records: Sequence[OutputRecord],
        results: EncodedResults,
        prov: Provenance,
        trace: ScoringTrace | None,
        score_ms: float,
    ) -> int | None:
        """Publish ``prov`` if new, spool the trajectory; returns the ledger ticket for :meth:`settle`."""
        await self.publish_once(prov)
        last = results.results[-1]
        sample = trajectory_sample(records)
        ds = str(sample.get("data_source", ""))
        self.health.record(ds, reward=last.reward_score, failure_kind=None, latency_ms=last.latency_ms)
        if self.ledger is None:
            return None
        final = records[-1]
        response = trace.response_of(int(final.response_ids.shape[0])) if trace is not None else None
        judged = trace.judged if trace is not None else {}
        facts = TrajectoryFacts(
            records,
            sample,
            RESULT_FIELDS,
            results.rows,
            attempt=o.attempts,
            put_ts=o.entry.ts,
            score_ms=score_ms,
            provenance=prov.digest,
            response=response,
            judge=[[i, d, a] for i, (d, a) in sorted(judged.items())],
            payloads=o.payloads,  # spooled as read: the flusher decodes them, not the worker
        )
        return self.ledger.scored(facts, prov.blob)

    async def before_failure(
        self,
        o: StoreOutcome,
        records: Sequence[OutputRecord] | None,
        reason: str,
        failure: FailureKind,
        scored: tuple[ScoringTrace, float] | None = None,
    ) -> tuple[Provenance, FailureRows | None]:
        """Publish the provenance of a trajectory about to get an error result for every key, and
        spool it (its records when they decoded, else its keys); returns that provenance and its
        rows, to settle by what the fail script wrote (:mod:`rewardq.consumers.failure_rows`).
        ``scored``: the trace and time (ms) of the manager's run that raised: the rows keep the
        final response it decoded, and that time."""
        rec = o.record
        sample = trajectory_sample(records) if records else (rec.sample or {})
        prov = self.provenance_of(sample)
        await self.publish_once(prov)
        latency = (time.time() - o.entry.ts) * 1000.0 if o.entry.ts else None
        self.health.record(
            str(sample.get("data_source", "")), reward=None, failure_kind=failure.value, latency_ms=latency
        )
        if self.ledger is None:
            return prov, None
        response = score_ms = None
        if scored is not None and records:
            response = scored[0].response_of(int(records[-1].response_ids.shape[0]))
            score_ms = scored[1]
        n = len(records) if records else max(len(o.payloads), rec.index + 1)
        rows = self._failure_rows(
            rec.uid,
            rec.session_id,
            list(range(n)),
            sample,
            reason,
            failure,
            attempt=o.attempts,
            final=n - 1,
            put_ts=o.entry.ts,
            provenance=(prov.digest, prov.blob),
            known={r.index: r for r in records or ()},
            response=response,
            score_ms=score_ms,
        )
        return prov, rows.spool()

    def before_dead_letter(
        self,
        uid: str,
        session_id: str,
        index: int,
        record: OutputRecord | None,
        reason: str,
        failure: FailureKind,
        *,
        attempt: int,
        put_ts: float,
        own_key: bool = False,
        spool: bool = True,
        max_outputs: int,
        known: Sequence[OutputRecord] = (),
    ) -> FailureRows | None:
        """The rows of the keys a dead letter answers (the intake's refusals: a record that does not
        decode, conflicts, is too large or was delivered too often), spooled (``spool``) before their
        error results are written and the entry acknowledged: keys ``0..index`` (the key it names,
        and those before it; ``own_key``: the key it names only), with no ids (None without a
        ledger). Their rows say what their error results say: nothing scored them, so no provenance
        and no manager, and ``attempt`` (0: none, never scored), until the fail script says which
        keys it wrote with which attempt (:meth:`FailureRows.settle`). An index at or past
        ``max_outputs`` (a record's, never bounded by it) has the key it names alone spooled here,
        as the script answers it alone beside the keys it knows. ``known``: decoded records of
        the trajectory, failing with it or parked in its hash, in index order (their rows keep ids,
        and give every row their sample when ``record`` carries none)."""
        if self.ledger is None:
            return None
        sample = (record.sample if record is not None else None) or trajectory_sample(known)
        last = max(index, 0)
        first = last if own_key or last >= max_outputs else 0
        # the key it names: the last one it knows; a late key (own_key), past the trajectory's final
        # output, is never its final row (readers take a trajectory's final row as its row)
        final = (record.final if record is not None else True) and not own_key
        rows = self._failure_rows(
            uid,
            session_id,
            list(range(first, last + 1)) if spool else [],
            sample,
            reason,
            failure,
            attempt=attempt,
            final=last if final else -1,
            put_ts=put_ts,
            provenance=None,
            known={r.index: r for r in known},
        )
        return rows.spool()

    def _failure_rows(
        self,
        uid: str,
        session_id: str,
        indexes: list[int],
        sample: Mapping[str, object],
        reason: str,
        failure: FailureKind,
        *,
        attempt: int,
        final: int,
        put_ts: float,
        provenance: tuple[str, Mapping[str, object]] | None,
        known: Mapping[int, OutputRecord] | None = None,
        response: str | None = None,
        score_ms: float | None = None,
    ) -> FailureRows:
        """A failure's rows (:class:`FailureRows`); none scored by a manager (``manager`` empty, as
        their error results say: the provenance blob names the manager)."""
        ledger = self.ledger
        assert ledger is not None

        def spool_rows(records: list[OutputRecord], at: int) -> int | None:
            # only a hostile record names an index past int32: the ledger's column cannot hold it
            # (counted once, when the script says it wrote that key: unkept)
            kept = [r for r in records if r.index <= INT32_MAX]
            return ledger.failed(
                uid,
                session_id,
                kept,
                sample,
                reason,
                failure_kind=failure.value,
                manager="",
                attempt=at,
                put_ts=put_ts,
                provenance=provenance,
                response=response,
                score_ms=score_ms,
            )

        def unkept(index: int) -> None:
            ledger.counts["refused"] += 1
            logger.warning("ledger: key %s_%s_%d has no row: its index is past int32", uid, session_id, index)

        return FailureRows(
            uid, session_id, indexes, attempt, final, spool_rows, ledger.settle, known=dict(known or {}), unkept=unkept
        )

    @property
    def expired_records_bytes(self) -> int:
        """What the expire script returns of the records of the trajectories it ends, per call:
        nothing without a ledger (0)."""
        return 0 if self.ledger is None else EXPIRED_RECORDS_BYTES

    def spool_expired(self, ended: Expired, *, max_record_bytes: int, max_outputs: int) -> None:
        """Spool a trajectory the expire script ended (``incomplete_timeout``): one row per key it
        gave the error result, with the ids and sample of the outputs that had arrived (the others
        identity only). Its results and acks are written by then, in the script: a worker killed
        between the script and this write leaves the trajectory out of the ledger (docs/ledger.md).
        Synchronous, so a worker stopping meanwhile cannot cut it short. Its rows say what its
        error results say: nothing scored it, so no provenance, no manager and attempt 0."""
        if self.ledger is None or not ended.wrote:  # no key got its error result: each kept the one it had
            return
        decoded: list[OutputRecord | None] = []
        for data in ended.records:
            try:
                rec = None if data is None else decode_output(data, max_bytes=max_record_bytes, max_outputs=max_outputs)
            except Exception:  # noqa: BLE001 - a record that does not decode: its row keeps the identity only
                rec = None
            decoded.append(rec if rec is not None and rec.tid == ended.tid else None)
        known = [r for r in decoded if r is not None]
        if not known:  # no uid or session id to name its keys by: no row by design
            self.ledger.counts["refused"] += 1
            logger.warning("ledger: expired trajectory %s had no readable record: it has no ledger row", ended.tid)
            return
        sample = trajectory_sample(known)
        uid, sid = known[0].uid, known[0].session_id
        n = max(ended.keys, len(decoded))
        records = [
            (decoded[i] if i < len(decoded) else None) or stub_record(uid, sid, i, final=i == n - 1)
            for i in ended.wrote
        ]
        ticket = self.ledger.failed(
            uid,
            sid,
            records,
            sample,
            ended.reason,
            failure_kind=FailureKind.INPUT.value,
            manager="",
            attempt=0,
            put_ts=0.0,
            provenance=None,
            latency_ms=ended.latency_ms,  # the script's, as its results hold it
        )
        self.ledger.settle(ticket, True)

    def settle(self, ticket: int | None, committed: bool | None) -> None:
        if self.ledger is not None:
            self.ledger.settle(ticket, committed)

    def snapshot(self) -> dict[str, Any] | None:
        """The ledger's state for the heartbeat (None without a ledger)."""
        return self.ledger.snapshot() if self.ledger is not None else None


def open_ledger(cfg: Any, worker_name: str) -> Ledger | None:
    """The ledger a :class:`~rewardq.config.WorkerConfig` asks for, opened (None when ``ledger`` is
    unset). A missing ``ledger`` extra is a ConfigError; a spool that cannot be opened is logged
    loudly and leaves the worker scoring without a ledger (its status says so)."""
    if not cfg.ledger:
        return None
    from rewardq.ledger.sink import Ledger, require_writer

    require_writer()
    ledger = Ledger(
        cfg.ledger,
        worker=worker_name,
        spool=cfg.ledger_spool,
        flush_interval=cfg.ledger_flush_interval,
        file_bytes=cfg.ledger_file_bytes,
        spool_max_bytes=cfg.ledger_spool_max_bytes,
    )
    ledger.open()
    return ledger
