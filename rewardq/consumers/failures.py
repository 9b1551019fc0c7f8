"""How a worker fails a record or a trajectory: dead letter + error result for every key.

:class:`FailureHandler` is a collaborator of :class:`~rewardq.consumers.worker.Worker`, like
:class:`~rewardq.consumers.commits.CommitCoalescer`: it is given the broker, the
worker's name and its counters, and does nothing else. Every failure ends in a visible,
explained state: a dead letter holding the raw entry, the reason, the traceback where there
is one, the delivery count and the worker; and an error result for every key of the
trajectory, so a waiting trainer is released. Each error result says what kind of failure it
is (``failure_kind``): the dead letter's kind decides it (:data:`~rewardq.queue.states.DEAD_LETTER_FAILURE`)
unless the caller knows better (a scoring failure: the exception's kind,
:func:`~rewardq.queue.states.failure_kind_of`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from rewardq.consumers.assembly import RecordDecoder, trajectory_sample
from rewardq.consumers.failure_rows import FailureRows, with_parked_records
from rewardq.consumers.metrics import Metrics
from rewardq.consumers.presence import Presence
from rewardq.consumers.retries import RoomWaits
from rewardq.errors import RecordError, RedisPermissionError, TokenizerMismatch, TrajectoryTooLarge
from rewardq.queue.broker import StreamBroker
from rewardq.queue.codec import OutputRecord, peek_identity
from rewardq.queue.connection import being_cancelled, is_refused_permission, permission_error
from rewardq.queue.endings import Failed
from rewardq.queue.entries import Entry
from rewardq.queue.keys import parse_key, trajectory_id
from rewardq.queue.states import DEAD_LETTER_FAILURE, DeadLetterKind, FailureKind

if TYPE_CHECKING:
    from rewardq.consumers.accounting import Accounting

logger = logging.getLogger("rewardq.worker")

T = TypeVar("T")

#: A record dead-lettered with its entry is kept whole up to this size (so ``rewardq dead-letters
#: retry`` can put it back); a larger one keeps its first ``DEAD_DATA_CAP`` bytes only.
DEAD_RECORD_WHOLE = 1024 * 1024
DEAD_DATA_CAP = 64 * 1024


class FailureHandler:
    """Dead-lettering for one worker (see the module doc).

    Args:
        broker: the worker's gateway to Redis.
        worker_name: written into every dead letter.
        max_record_bytes: records larger than this (or than 1 MiB) keep only their first 64 KiB in
            the dead letter.
        stats: the worker's counters; ``dead_letters`` and ``errors`` are incremented here.
        metrics: the worker's metrics hooks (dead letters by kind, failures by data source and kind).
        presence: the worker's heartbeat, which counts failures by data source and kind too.
        accounting: the worker's provenance and ledger: the keys a dead letter answers are spooled
            to the ledger before their error results are written, then settled key by key by what
            the fail script wrote (:mod:`rewardq.consumers.failure_rows`).
        room: waits out a failure's write that Redis refuses past ``maxmemory`` (None: raise it).
        decode: the worker's decoder: with a ledger, a trajectory failing at intake has the records
            parked in its hash read back and decoded with it, for its rows (:meth:`parked`; None:
            not read).
    """

    def __init__(
        self,
        broker: StreamBroker,
        *,
        worker_name: str,
        max_record_bytes: int,
        stats: dict[str, int],
        metrics: Metrics,
        presence: Presence | None = None,
        accounting: Accounting | None = None,
        room: RoomWaits | None = None,
        decode: RecordDecoder | None = None,
    ) -> None:
        self.broker = broker
        self.decode = decode
        self.accounting = accounting
        self.room = room
        self.ks = broker.ks
        self.worker_name = worker_name
        self.max_record_bytes = max_record_bytes
        self.stats = stats
        self.metrics = metrics
        self.presence = presence

    async def dead_letter(
        self,
        entry: Entry,
        kind: DeadLetterKind,
        reason: str,
        *,
        record: OutputRecord | None = None,
        tb: str = "",
        late: str = "",
        batch: Sequence[tuple[Entry, OutputRecord]] = (),
    ) -> bool:
        """Dead-letter one entry; if it names a trajectory, every key of it gets an error result.

        The trajectory and output are the record's when it decoded, else the entry's ``key`` field
        when it is a well-formed output key (a record naming another key, e.g. refused for the
        mismatch, leaves that key's trajectory alone), else what can be read of the record
        (:func:`peek_identity`).
        Keys that already have a result keep it. ``batch``: decoded records of that trajectory read
        with ``entry`` and not stored: they fail with it (their keys get the error result, their
        entries are acknowledged with its dead letter, their rows keep ids and sample) unless
        ``entry`` names an index at or past ``max_outputs`` or another shard, or ``batch`` holds
        ``max_outputs`` entries or more; returns whether they did. The records of the trajectory
        stored earlier (parked in its hash) are read back for the rows too (:meth:`with_parked`).
        ``late``: the record came after its trajectory finished
        (:attr:`~rewardq.queue.entries.StoreOutcome.late`): only its own key can get an error
        result, and only when it has none (``open``), so only then does it get a ledger row; one
        whose key keeps its result (``kept``) has none, the dead letter being all that changed.
        """
        ident = self._identity(entry, record)
        failure = DEAD_LETTER_FAILURE[kind]
        dead = self._dead_fields(entry, kind, reason, tb, tid=ident[0] if ident else "", failure=failure)
        what = f"the dead letter of entry {entry.id}"
        known = [rec for _, rec in batch]
        data_source = str(trajectory_sample([record] if record is not None else known).get("data_source", ""))
        took = False
        if ident is None:
            await self._write(what, lambda: self.broker.dead_letter_entry(entry, dead))
        else:
            tid, idx = ident
            shard = self.ks.shard_of(tid)
            took = self._takes(entry, shard, tid, idx, batch)
            if took:  # the keys of the records failing with it are answered too
                idx = str(max(int(idx), *(rec.index for rec in known)))
            for_rows = known if took else []
            if not late:  # its outputs stored earlier, for the rows (a late one's trajectory has none)
                for_rows = await self.with_parked(shard, tid, for_rows)
            # nothing scored the keys it answers: attempt 0, unless the fail script finds the
            # trajectory's hash counted scoring attempts (it reads them atomically, and the rows
            # are settled by what it wrote: FailureRows)
            rows = self.spool(
                entry,
                record,
                reason,
                failure,
                own_key=bool(late),
                before=late != "kept",
                index=int(idx) if took else None,
                known=for_rows,
            )
            also_ack = [e for e, _ in batch] if took else []
            failed: Failed | None = None
            try:
                if shard != entry.shard:  # record routed to the wrong shard: answer on its own shard
                    await self._write(what, lambda: self.broker.dead_letter_entry(entry, dead))
                    failed = await self._write(
                        f"the error results of {tid}",
                        lambda: self.broker.fail(shard, tid, reason, index=idx, entry=None, kind=failure),
                    )
                else:
                    failed = await self._write(
                        f"the error results of {tid}",
                        lambda: self.broker.fail(
                            shard, tid, reason, index=idx, entry=entry, dead=dead, also_ack=also_ack, kind=failure
                        ),
                    )
            finally:
                self.settle(rows, failed)
        self._count(kind, failure, data_source)
        logger.warning("dead-lettered entry %s (%s): %s", entry.id, kind, reason[:2000])
        return took

    def _takes(self, entry: Entry, shard: int, tid: str, idx: str, batch: Sequence[tuple[Entry, OutputRecord]]) -> bool:
        """Whether ``batch`` fails with ``entry`` (see :meth:`dead_letter`): the fail script answers
        their keys (all below ``max_outputs``) and acknowledges at most ``max_outputs`` entries."""
        max_out = self.broker.max_outputs
        return (
            bool(batch)
            and shard == entry.shard
            and len(batch) < max_out
            and (idx == "-1" or (idx.isdigit() and int(idx) < max_out))
            and all(e.shard == shard and rec.tid == tid for e, rec in batch)
        )

    async def with_parked(self, shard: int, tid: str, known: Sequence[OutputRecord] = ()) -> list[OutputRecord]:
        """``known`` (records of trajectory ``tid`` the failing batch holds) and the records of it
        parked in its hash (stored by an earlier batch or another worker) that decode with the
        worker's decoder, in index order: read for a failure's ledger rows only (not without a
        ledger or a decoder), within the bounds of :mod:`rewardq.queue.parked`. A parked record
        that does not decode (or names another key) is not used. A read Redis fails leaves
        ``known`` alone (the rows then have no sample unless it gives one, and the parked keys no
        ids), with one warning: the failure goes on."""
        if self.decode is None or self.accounting is None or self.accounting.ledger is None:
            return list(known)
        try:
            parked = await self.broker.parked(shard, tid, skip={rec.index for rec in known})
        except Exception as exc:  # the rows are not worth failing the failure for
            if being_cancelled():
                raise
            logger.warning("ledger: the records of %s parked in Redis could not be read for its rows: %s", tid, exc)
            return list(known)
        return with_parked_records(known, parked, self.decode, tid)

    def trajectory_of(self, entry: Entry) -> str | None:
        """The id of the trajectory an entry that did not decode answers for (None: none)."""
        ident = self._identity(entry, None)
        return ident[0] if ident is not None else None

    async def _write(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """One write of a failure, waited out while Redis is past ``maxmemory`` (``room``)."""
        if self.room is None:
            return await call()
        return await self.room.retrying(what, call)

    async def fail_trajectory(
        self,
        shard: int,
        tid: str,
        entry: Entry,
        kind: DeadLetterKind,
        reason: str,
        tb: str = "",
        *,
        also_ack: Sequence[Entry] = (),
        last_index: int = -1,
        failure: FailureKind | None = None,
        extra_info: Mapping[str, object] | None = None,
        data_source: str = "",
        provenance: str = "",
        attempt: int = 0,
    ) -> Failed:
        """Fail a whole trajectory (scoring failed, or its stored records are bad); ``also_ack``:
        its other entries this worker holds, acknowledged with it; ``last_index``: its final index
        when Redis does not know it yet (a trajectory read whole and refused before its claim);
        ``failure``: its error results' kind (default: the dead letter's,
        :data:`~rewardq.queue.states.DEAD_LETTER_FAILURE`); ``extra_info``: more of their
        ``reward_extra_info``, beside ``error``; ``data_source``: its sample's, for the counts;
        ``provenance``, ``attempt``: what failed, on which attempt. Returns which keys the fail
        script gave an error result, with which attempt."""
        failure = failure or DEAD_LETTER_FAILURE[kind]
        dead = self._dead_fields(entry, kind, reason, tb, tid=tid, failure=failure)
        failed = await self._write(
            f"the error results of {tid}",
            lambda: self.broker.fail(
                shard,
                tid,
                reason,
                index=last_index,
                entry=entry,
                dead=dead,
                also_ack=also_ack,
                kind=failure,
                extra_info=extra_info,
                provenance=provenance,
                attempt=attempt,
            ),
        )
        self._count(kind, failure, data_source)
        logger.warning("trajectory %s failed (%s): %s", tid, kind, reason[:2000])
        return failed

    async def exhausted(self, entries: Sequence[Entry], max_deliveries: int) -> None:
        """Dead-letter entries delivered more than ``max_deliveries`` times: one dead letter per
        trajectory (every key answered, every one of these entries acknowledged), whose reason says
        how the earlier attempts ended, as the trajectory's hash recorded them."""
        by_tid: dict[str, list[tuple[Entry, str]]] = {}
        for entry in entries:
            ident = self._identity(entry, None)
            if ident is None:
                reason = exhausted_reason(entry.deliveries, max_deliveries, None)
                await self.dead_letter(entry, DeadLetterKind.EXHAUSTED, reason)
                continue
            by_tid.setdefault(ident[0], []).append((entry, ident[1]))
        for tid, items in by_tid.items():
            shard = self.ks.shard_of(tid)
            first, index = items[0]
            if shard != first.shard:  # routed to the wrong shard: answer by the dead-letter path
                for entry, _ in items:
                    await self.dead_letter(
                        entry, DeadLetterKind.EXHAUSTED, exhausted_reason(entry.deliveries, max_deliveries, None)
                    )
                continue
            history = await self.broker.attempts.attempt_history(shard, tid)
            reason = exhausted_reason(max(e.deliveries for e, _ in items), max_deliveries, history)
            failure = DEAD_LETTER_FAILURE[DeadLetterKind.EXHAUSTED]
            last = max(items, key=lambda item: int(item[1]) if item[1].isdigit() else -1)
            # its error results (and rows) carry the delivery count as their attempt, or the scoring
            # attempts its hash counted when more (the fail script's): at least any attempt a worker
            # that died scoring it spooled, so its rows (later) win the ledger's dedup
            attempt = max(e.deliveries for e, _ in items)
            rows = self.spool(last[0], None, reason, failure, attempt=attempt, known=await self.with_parked(shard, tid))
            dead = self._dead_fields(first, DeadLetterKind.EXHAUSTED, reason, "", tid=tid, failure=failure)
            write = functools.partial(
                self.broker.fail,
                shard,
                tid,
                reason,
                index=index if len(items) == 1 else -1,
                entry=first,
                dead=dead,
                also_ack=[e for e, _ in items[1:]],
                kind=failure,
                attempt=attempt,
            )
            failed: Failed | None = None
            try:
                # a key not written (another worker finished it meanwhile) keeps its result: its row
                # is settled committed = false
                failed = await self._write(f"the error results of {tid}", write)
            finally:
                self.settle(rows, failed)
            self._count(DeadLetterKind.EXHAUSTED, failure, "")
            logger.warning("trajectory %s dead-lettered (exhausted): %s", tid, reason)

    @staticmethod
    def settle(rows: FailureRows | None, failed: Failed | None) -> None:
        """Settle a failure's ledger rows by what the fail script wrote (``failed``; None: it did
        not run to its end)."""
        if rows is not None:
            rows.settle(failed)

    def spool(
        self,
        entry: Entry,
        record: OutputRecord | None,
        reason: str,
        failure: FailureKind,
        *,
        attempt: int = 0,
        own_key: bool = False,
        before: bool = True,
        index: int | None = None,
        known: Sequence[OutputRecord] = (),
    ) -> FailureRows | None:
        """Spool the keys ``entry`` answers to the ledger (None: no ledger, or its names unreadable):
        ``own_key``, the key it names only; ``attempt``: the one its error results say (0: none);
        ``before`` False: none yet (a late key that keeps its result), only the keys the fail
        script writes, after it; ``index``: the last key it answers, when more than it names;
        ``known``: decoded records of its trajectory (their rows keep ids and sample). Settle them
        with :meth:`settle`."""
        if self.accounting is None or self.accounting.ledger is None:
            return None
        names = _names(entry, record)
        if names is None:
            return None
        uid, session_id, named = names
        try:
            ts = float(entry.fields.get(b"ts", b"") or 0.0)
        except (TypeError, ValueError):
            ts = 0.0
        return self.accounting.before_dead_letter(
            uid,
            session_id,
            named if index is None else index,
            record,
            reason,
            failure,
            attempt=attempt,
            put_ts=ts,
            own_key=own_key,
            spool=before,
            max_outputs=self.broker.max_outputs,
            known=known,
        )

    @staticmethod
    def _identity(entry: Entry, record: OutputRecord | None) -> tuple[str, str] | None:
        """``(trajectory id, index digits or "-1")`` an entry answers for, or None (:func:`_names`)."""
        names = _names(entry, record)
        return None if names is None else (trajectory_id(names[0], names[1]), str(names[2]))

    def _count(self, kind: str, failure: FailureKind, data_source: str) -> None:
        self.stats["dead_letters"] += 1
        self.stats["errors"] += 1
        self.metrics.dead_letter(kind)
        self.count_failure(failure, data_source)

    def count_failure(self, failure: FailureKind, data_source: str) -> None:
        """Count error results of kind ``failure`` for ``data_source`` ("": not known)."""
        self.metrics.failed(failure, data_source)
        if self.presence is not None:
            self.presence.failed(data_source, failure)

    def _dead_fields(
        self, entry: Entry, kind: str, reason: str, tb: str, *, tid: str = "", failure: FailureKind
    ) -> dict[str, object]:
        return {
            "entry_id": entry.id,
            "stream": self.ks.stream(entry.shard),
            "key": entry.key,
            "tid": tid,
            "kind": kind,
            "failure_kind": failure,
            "reason": reason[:4000],
            "traceback": tb[-8000:],
            "deliveries": entry.deliveries,
            "worker": self.worker_name,
            "time": f"{time.time():.6f}",
            "ts": entry.fields.get(b"ts", b""),
            **self._dead_data(entry),
        }

    def _dead_data(self, entry: Entry) -> dict[str, object]:
        """The raw record kept in a dead letter: whole up to ``DEAD_RECORD_WHOLE`` (or
        ``max_record_bytes`` when smaller), else its first ``DEAD_DATA_CAP`` bytes, with
        ``data_bytes`` (the record's size) and ``truncated`` saying so: a cut record cannot be put
        back by ``rewardq dead-letters retry``."""
        data = entry.data if isinstance(entry.data, (bytes, bytearray)) else b""
        if len(data) <= min(DEAD_RECORD_WHOLE, self.max_record_bytes):
            return {"data": bytes(data)}
        return {"data": bytes(data[:DEAD_DATA_CAP]), "data_bytes": len(data), "truncated": 1}


def _names(entry: Entry, record: OutputRecord | None) -> tuple[str, str, int] | None:
    """``(uid, session_id, index)`` an entry answers for (index -1: not known), or None: the
    record's when it decoded (its key is the entry's: one that is not is refused undecoded); else
    the key the entry's ``key`` field names, when well-formed, which is what the stream routed and
    what its producer waits on (a record claiming another key never touches that key's
    trajectory, possibly another producer's); else what can be read of the record
    (:func:`peek_identity`)."""
    if record is not None:
        return record.uid, record.session_id, record.index
    named = parse_key(entry.key)
    if named is not None:
        return named[0], named[1], int(named[2])
    return peek_identity(entry.data)


def permission_refusal(exc: BaseException, namespace: str, url: str) -> RedisPermissionError | None:
    """The one-line error (exit code 2, the ``ACL SETUSER`` grant named) when ``exc`` is, or was
    caused by, Redis refusing a command for lack of permission (``NOPERM``); else None.

    A permission revoked while a worker runs is nobody's trajectory's fault: the worker stops
    with this line (as the start-up check would have), and leaves what it holds pending, for a
    worker with the rights to reclaim.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, RedisPermissionError):
            return cur
        if isinstance(cur, Exception) and is_refused_permission(cur):
            return permission_error(cur, namespace, url)
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def refusal(exc: RecordError, tid: str) -> tuple[DeadLetterKind, str]:
    """The dead-letter kind and reason of a trajectory whose stored records cannot be scored."""
    if isinstance(exc, TrajectoryTooLarge):
        return DeadLetterKind.INVALID, f"trajectory {tid}: {exc.message}"
    if isinstance(exc, TokenizerMismatch):
        return DeadLetterKind.TOKENIZER, str(exc)
    return DeadLetterKind.INVALID, f"invalid record: {exc}"


def exhausted_reason(deliveries: int, max_deliveries: int, history: dict[str, Any] | None) -> str:
    """Why a trajectory ran out of deliveries, from what its hash recorded of its attempts.

    ``attempts`` counts the scoring leases taken (hand-backs at shutdown take theirs back and are
    counted in ``handbacks``); ``unfinished`` the attempts that ended without an answer and said why
    (``last_failure``: a commit that failed, say). An attempt that said nothing ended with its
    worker: only then is a crash named.
    """
    head = f"delivered {deliveries} times without an answer (max_deliveries={max_deliveries})"
    if history is None:
        return f"{head}; no trajectory could be read from it, so nothing is known of the earlier deliveries"
    attempts, unfinished, last = history["attempts"], history["unfinished"], history["last_failure"]
    handbacks = history.get("handbacks", 0)
    silent = attempts - unfinished
    parts = []
    if handbacks > 0:
        parts.append(f"{handbacks} attempt(s) were handed back unfinished by workers that were stopping")
    if silent > 0:
        parts.append(
            f"{silent} scoring attempt(s) never reported back: the worker scoring it died each time "
            "(a crash, a kill, an out-of-memory kill) or lost its lease"
        )
    if unfinished > 0:
        why = last or "of an unknown error"
        parts.append(f"{unfinished} attempt(s) failed without a result, the last because {why}")
    if not parts:
        parts.append(
            "it was never scored: each delivery ended before its trajectory was complete and leased "
            "(the worker reading it died, or Redis refused to store it)"
        )
    return f"{head}; " + "; ".join(parts)
