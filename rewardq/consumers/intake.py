"""Handling a batch of entries: decode -> reject | claim whole | store -> hand on to scoring.

:class:`Intake` is a collaborator of :class:`~rewardq.consumers.worker.Worker`, like
:class:`~rewardq.consumers.commits.CommitCoalescer`: it is given the broker, the failure
handler, the record bounds, the worker's counters and metrics, and the callback that starts
scoring a trajectory. Each batch, read or reclaimed, ends as:

* a dead letter (with an error result for its keys) for every entry whose record does not decode;
  the trajectory it names fails with it, and that trajectory's other entries in the batch are
  acknowledged with it (no dead letter of their own); and one per trajectory whose entries were
  delivered more than ``max_deliveries`` times (its
  reason says how the earlier attempts ended: a worker that died, or commits that failed);
* an error result for every key of a trajectory whose records total more than
  ``max_trajectory_bytes`` (checked here for a trajectory read whole, by ``store`` otherwise);
* a lease on every trajectory whose outputs ``0..final`` all came in this batch, first
  delivery each: one ``claim`` script per trajectory (``lua/claim.lua``) instead of one
  ``store`` per output;
* the ``store`` script's answer for every other record (parked, complete, leased, done, conflict).

A read's batch may hold back the trajectory its last entry starts but does not finish, for the
next read (:mod:`rewardq.consumers.reader`); those records are handled with that read's batch.

Every trajectory this worker now holds the lease of goes to ``on_complete`` as soon as the
lease is known, so its scoring starts while the rest of the batch is still being filed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence

from rewardq.consumers.assembly import RecordDecoder
from rewardq.consumers.failures import FailureHandler
from rewardq.consumers.metrics import Metrics
from rewardq.errors import RecordError, TokenizerMismatch, TrajectoryTooLarge
from rewardq.queue.broker import StreamBroker
from rewardq.queue.checks import MAX_TRAJECTORY_BYTES, check_trajectory_bytes
from rewardq.queue.codec import OutputRecord
from rewardq.queue.endings import Failed
from rewardq.queue.entries import Entry, StoreOutcome
from rewardq.queue.states import DeadLetterKind, FailureKind

logger = logging.getLogger("rewardq.worker")

#: A decoded entry: the entry, its record, its raw payload.
Filed = tuple[Entry, OutputRecord, bytes]
#: An entry whose record did not decode: the entry, its dead letter's kind and reason.
Refused = tuple[Entry, DeadLetterKind, str]
#: A trajectory read whole: its shard, its id, its entries in index order.
Whole = tuple[int, str, list[Filed]]


def split_whole(valid: Sequence[Filed]) -> tuple[list[Whole], list[Filed]]:
    """The trajectories whose outputs ``0..final`` are all in ``valid``, each delivered once, and the rest.

    Only those can take the ``claim`` fast path: a partial trajectory, a second final output
    or a redelivery needs what Redis already knows about it (``store``), and a record that came
    as a blob is kept by reference, blob and all, by ``store`` (:mod:`rewardq.queue.blobs`).
    """
    groups: dict[tuple[int, str], list[Filed]] = {}
    for item in valid:
        entry, rec, _ = item
        groups.setdefault((entry.shard, rec.tid), []).append(item)
    whole: list[Whole] = []
    rest: list[Filed] = []
    for (shard, tid), items in groups.items():
        items.sort(key=lambda it: it[1].index)
        recs = [it[1] for it in items]
        if (
            all(r.index == i for i, r in enumerate(recs))
            and recs[-1].final
            and not any(r.final for r in recs[:-1])
            and all(it[0].deliveries == 1 and b"blob" not in it[0].fields for it in items)
        ):
            whole.append((shard, tid, items))
        else:
            rest.extend(items)
    return whole, rest


#: The most records, and bytes of records, held back for one trajectory between two reads; past
#: either, its records are filed as they come (``store``), as before. Bounds the memory held
#: between reads (a read itself is sized to ~16 MiB) and the sorting each read repeats.
HOLD_MAX_RECORDS = 64
HOLD_MAX_BYTES = 16 * 1024 * 1024


def trailing_partials(
    carried: Sequence[Filed], new: Sequence[Filed], max_outputs: int, shards: Collection[int]
) -> list[Filed]:
    """The records of each shard's last trajectory in a read, when the read cut it short (of ``shards`` only).

    ``new`` holds a read's records in stream order, ``carried`` the ones held back from the read
    before. The trajectory of each shard's last record in ``new`` is held back when its records
    here (both lists) are outputs ``0..k`` with no final among them, each delivered once, none a
    blob, fewer than ``max_outputs`` and :data:`HOLD_MAX_RECORDS`, of at most :data:`HOLD_MAX_BYTES`
    in all: the rest of it is most likely the next entries of the stream (a producer sends a
    trajectory's outputs in one transaction), which the next read returns.
    """
    last: dict[int, str] = {}
    for entry, rec, _ in new:
        if entry.shard in shards:
            last[entry.shard] = rec.tid
    if not last:
        return []
    groups: dict[tuple[int, str], list[Filed]] = {(s, t): [] for s, t in last.items()}
    for item in (*carried, *new):
        group = groups.get((item[0].shard, item[1].tid))
        if group is not None:
            group.append(item)
    held: list[Filed] = []
    most = min(max_outputs, HOLD_MAX_RECORDS + 1)
    for items in groups.values():
        if len(items) >= most or sum(len(raw) for _, _, raw in items) > HOLD_MAX_BYTES:
            continue
        items.sort(key=lambda it: it[1].index)
        if all(
            rec.index == i and not rec.final and entry.deliveries == 1 and b"blob" not in entry.fields
            for i, (entry, rec, _) in enumerate(items)
        ):
            held.extend(items)
    return held


class Intake:
    """Turns batches of stream entries into trajectories to score (see the module doc).

    Args:
        broker: the worker's gateway to Redis.
        failures: dead-letters the entries that are rejected here.
        max_deliveries: an entry delivered more often than this is dead-lettered unread.
        decode: the worker's decoder (its record bounds and tokenizer fingerprint); a record made
            with another vocabulary is dead-lettered (kind ``tokenizer``), with an error result
            naming both tokenizers.
        max_outputs: the most outputs a trajectory may have.
        max_trajectory_bytes: the most a trajectory's records may total.
        stats: the worker's counters; ``read``, ``stored``, ``parked`` and ``duplicates`` are counted here.
        metrics: the worker's metrics hooks.
        on_complete: called with every trajectory whose lease this worker now holds; it must score it.
    """

    def __init__(
        self,
        broker: StreamBroker,
        failures: FailureHandler,
        *,
        max_deliveries: int,
        decode: RecordDecoder,
        max_outputs: int,
        max_trajectory_bytes: int = MAX_TRAJECTORY_BYTES,
        stats: dict[str, int],
        metrics: Metrics,
        on_complete: Callable[[StoreOutcome], None],
    ) -> None:
        self.broker = broker
        self.failures = failures
        self.max_deliveries = max_deliveries
        self.decode = decode
        self.max_trajectory_bytes = max_trajectory_bytes
        self.max_outputs = max_outputs
        self.stats = stats
        self.metrics = metrics
        self.on_complete = on_complete

    async def handle(
        self, entries: list[Entry], carried: Sequence[Filed] = (), *, hold_tail: Collection[int] = ()
    ) -> list[Filed]:
        """Decode, store and dispatch a batch of entries (from a read or a reclaim).

        ``carried``: records an earlier read of the same loop held back (see below), handled with
        this batch. ``hold_tail``: the shards another read follows at once (their streams gave all
        the read asked for); the trajectory each one's last entry starts but does not finish is
        held back (:func:`trailing_partials`) and returned, to be handled with that read's
        entries, where it is usually whole and takes the ``claim`` path instead of one ``store``
        per record.
        """
        self.stats["read"] += len(entries)
        self.metrics.read(len(entries))
        new, refused = await self._decode(entries)
        held = trailing_partials(carried, new, self.max_outputs, hold_tail) if hold_tail else []
        valid = [*carried, *new]
        if held:
            kept = {id(it) for it in held}
            valid = [it for it in valid if id(it) not in kept]
        if refused:
            valid, held = await self._refuse(refused, valid, held)
        rest = await self._claim_whole(valid)
        for o in await self.broker.store(rest):
            self.stats["stored"] += 1
            if o.kind == "complete":
                self.on_complete(o)
            elif o.kind == "parked":
                self.stats["parked"] += 1
            elif o.kind == "conflict":
                reason = f"conflicting record: {o.detail}"
                await self.failures.dead_letter(o.entry, DeadLetterKind.CONFLICT, reason, record=o.record, late=o.late)
            elif o.kind == "toolarge":
                await self.failures.dead_letter(o.entry, DeadLetterKind.INVALID, o.detail, record=o.record)
            elif o.kind == "done":
                self.stats["duplicates"] += 1
            elif o.kind == "leased":
                logger.debug("%s is being scored by %s; leaving entry %s to it", o.record.tid, o.detail, o.entry.id)
        return held

    async def _decode(self, entries: list[Entry]) -> tuple[list[Filed], list[Refused]]:
        """The entries whose records decode within the bounds, and the others with their dead
        letter's kind and reason (:meth:`_refuse` dead-letters them)."""
        valid: list[Filed] = []
        refused: list[Refused] = []
        over = [e for e in entries if e.deliveries > self.max_deliveries]
        # deliveries spent bisecting a worker's death (its cohorts that never ended) are not counted:
        # they are at most log2 of a worker's slots per trajectory (rewardq.consumers.quarantine)
        spent = await self.broker.attempts.cohort_starts(over) if over else []
        exhausted = [e for e, n in zip(over, spent) if e.deliveries > self.max_deliveries + n]
        if exhausted:
            await self.failures.exhausted(exhausted, self.max_deliveries)
        for entry in entries:
            if entry in exhausted:
                continue
            try:
                if entry.blob_error:
                    raise RecordError("blob", entry.blob_error)
                rec = self.decode(entry.data)
                key = entry.key
                if key and key != rec.key:
                    raise RecordError("key", f"stream entry key {key!r} does not match the record's {rec.key!r}")
            except TokenizerMismatch as exc:
                refused.append((entry, DeadLetterKind.TOKENIZER, str(exc)))
                continue
            except RecordError as exc:
                refused.append((entry, DeadLetterKind.INVALID, f"invalid record: {exc}"))
                continue
            valid.append((entry, rec, bytes(entry.data)))
        return valid, refused

    async def _refuse(
        self, refused: Sequence[Refused], valid: list[Filed], held: list[Filed]
    ) -> tuple[list[Filed], list[Filed]]:
        """Dead-letter the entries that did not decode; returns ``valid`` and ``held`` without the
        records their failures took.

        A refused entry that names a trajectory fails it, and the records of that trajectory in
        this batch (read, carried or held back, in any order) fail with it: their keys get the
        error result, their entries are acknowledged with its dead letter and their decoded
        records give the ledger rows their ids and sample. Stored after the failure, they would
        each come late to a finished trajectory (a ``conflict`` dead letter apiece).
        """
        for entry, kind, reason in refused:
            tid = self.failures.trajectory_of(entry)
            batch: list[Filed] = []
            if tid is not None:
                taken = [it for it in (*valid, *held) if it[0].shard == entry.shard and it[1].tid == tid]
                if taken:
                    gone = {id(it) for it in taken}
                    valid = [it for it in valid if id(it) not in gone]
                    held = [it for it in held if id(it) not in gone]
                    batch = taken
            took = await self.failures.dead_letter(entry, kind, reason, batch=[(it[0], it[1]) for it in batch])
            if batch and not took:  # not failed with it (see FailureHandler.dead_letter): stored as usual
                valid.extend(batch)
        return valid, held

    async def _claim_whole(self, valid: list[Filed]) -> list[Filed]:
        """Start scoring every trajectory whose outputs 0..final all came in this batch.

        Returns the records that still need :meth:`StreamBroker.store`: partial trajectories,
        redeliveries, and trajectories Redis already knows.
        """
        whole, rest = split_whole(valid)
        whole = [w for w in whole if not await self._too_large(w)]
        if not whole:
            return rest
        claimed = await self.broker.claim_whole([(shard, tid, [it[0] for it in items]) for shard, tid, items in whole])
        for (_shard, _tid, items), ok in zip(whole, claimed):
            if not ok:
                rest.extend(items)
                continue
            self.stats["stored"] += len(items)
            final_entry, final_rec, _ = items[-1]
            self.on_complete(
                StoreOutcome(
                    "complete",
                    final_entry,
                    final_rec,
                    payloads=[it[2] for it in items],
                    records=[it[1] for it in items],
                )
            )
        return rest

    async def _too_large(self, whole: Whole) -> bool:
        """Fail a trajectory read whole whose records total more than ``max_trajectory_bytes``
        (every key answered, every entry acknowledged); True when it did."""
        shard, tid, items = whole
        total = sum(len(it[2]) for it in items)
        try:
            check_trajectory_bytes(total, self.max_trajectory_bytes, len(items))
        except TrajectoryTooLarge as exc:
            entries = [it[0] for it in items]
            reason = f"trajectory {tid}: {exc.message}"
            # every key gets an error result: each has its row first, as any dead letter's keys
            rows = self.failures.spool(entries[-1], items[-1][1], reason, FailureKind.INPUT)
            failed: Failed | None = None
            try:
                failed = await self.failures.fail_trajectory(
                    shard,
                    tid,
                    entries[-1],
                    DeadLetterKind.INVALID,
                    reason,
                    also_ack=entries[:-1],
                    last_index=len(entries) - 1,
                )
            finally:
                self.failures.settle(rows, failed)
            return True
        return False
