"""How a worker fails a record or a trajectory: dead letter + error result for every key.

:class:`FailureHandler` is a collaborator of :class:`~rewardq.consumers.worker.Worker`, like
:class:`~rewardq.consumers.commits.CommitCoalescer`: it is given the broker, the
worker's name and its counters, and does nothing else. Every failure ends in a visible,
explained state: a dead letter holding the raw entry, the reason, the traceback where there
is one, the delivery count and the worker; and an error result for every key of the
trajectory, so a waiting trainer is released.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rewardq.consumers.metrics import Metrics
from rewardq.queue.broker import StreamBroker
from rewardq.queue.codec import OutputRecord, peek_identity
from rewardq.queue.entries import Entry
from rewardq.queue.keys import parse_key, trajectory_id
from rewardq.queue.states import DeadLetterKind

logger = logging.getLogger("rewardq.worker")

#: Largest piece of an oversize record kept in its dead letter.
DEAD_DATA_CAP = 65536


class FailureHandler:
    """Dead-lettering for one worker (see the module doc).

    Args:
        broker: the worker's gateway to Redis.
        worker_name: written into every dead letter.
        max_record_bytes: records larger than this keep only their first 64 KiB in the dead letter.
        stats: the worker's counters; ``dead_letters`` and ``errors`` are incremented here.
        metrics: the worker's metrics hooks.
    """

    def __init__(
        self,
        broker: StreamBroker,
        *,
        worker_name: str,
        max_record_bytes: int,
        stats: dict[str, int],
        metrics: Metrics,
    ) -> None:
        self.broker = broker
        self.ks = broker.ks
        self.worker_name = worker_name
        self.max_record_bytes = max_record_bytes
        self.stats = stats
        self.metrics = metrics

    async def dead_letter(
        self, entry: Entry, kind: DeadLetterKind, reason: str, *, record: OutputRecord | None = None, tb: str = ""
    ) -> None:
        """Dead-letter one entry; if it names a trajectory, every key of it gets an error result.

        The trajectory and output are the record's when it decoded, else what can be read of it
        (:func:`peek_identity`), else the entry's ``key`` field when it is a well-formed output key.
        Keys that already have a result keep it.
        """
        ident = self._identity(entry, record)
        dead = self._dead_fields(entry, kind, reason, tb, tid=ident[0] if ident else "")
        if ident is None:
            await self.broker.dead_letter_entry(entry, dead)
        else:
            tid, idx = ident
            shard = self.ks.shard_of(tid)
            if shard != entry.shard:  # record routed to the wrong shard: answer on its own shard
                await self.broker.dead_letter_entry(entry, dead)
                await self.broker.fail(shard, tid, reason, index=idx, entry=None)
            else:
                await self.broker.fail(shard, tid, reason, index=idx, entry=entry, dead=dead)
        self._count(kind)
        logger.warning("dead-lettered entry %s (%s): %s", entry.id, kind, reason)

    async def fail_trajectory(
        self, shard: int, tid: str, entry: Entry, kind: DeadLetterKind, reason: str, tb: str = ""
    ) -> None:
        """Fail a whole trajectory (scoring failed, or its stored records are bad)."""
        await self.broker.fail(
            shard, tid, reason, index=-1, entry=entry, dead=self._dead_fields(entry, kind, reason, tb, tid=tid)
        )
        self._count(kind)
        logger.warning("trajectory %s failed (%s): %s", tid, kind, reason)

    @staticmethod
    def _identity(entry: Entry, record: OutputRecord | None) -> tuple[str, str] | None:
        """``(trajectory id, index digits or "-1")`` an entry answers for, or None."""
        if record is not None:
            return record.tid, str(record.index)
        named = parse_key(entry.key)
        peeked = peek_identity(entry.data)
        if peeked is not None:
            tid = trajectory_id(peeked[0], peeked[1])
            if peeked[2] >= 0:
                return tid, str(peeked[2])
            if named is not None and trajectory_id(named[0], named[1]) == tid:
                return tid, named[2]
            return tid, "-1"
        if named is not None:
            return trajectory_id(named[0], named[1]), named[2]
        return None

    def _count(self, kind: str) -> None:
        self.stats["dead_letters"] += 1
        self.stats["errors"] += 1
        self.metrics.dead_letter(kind)

    def _dead_fields(self, entry: Entry, kind: str, reason: str, tb: str, tid: str = "") -> dict[str, Any]:
        return {
            "entry_id": entry.id,
            "stream": self.ks.stream(entry.shard),
            "key": entry.key,
            "tid": tid,
            "kind": kind,
            "reason": reason[:4000],
            "traceback": tb[-8000:],
            "deliveries": entry.deliveries,
            "worker": self.worker_name,
            "time": f"{time.time():.6f}",
            "ts": entry.fields.get(b"ts", b""),
            "data": self._dead_data(entry),
        }

    def _dead_data(self, entry: Entry) -> bytes:
        """The raw record kept in a dead letter; an oversize one is cut to its first 64 KiB."""
        data = entry.data if isinstance(entry.data, (bytes, bytearray)) else b""
        return bytes(data[:DEAD_DATA_CAP]) if len(data) > self.max_record_bytes else bytes(data)
