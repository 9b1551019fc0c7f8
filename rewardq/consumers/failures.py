"""How a worker fails a record or a trajectory: dead letter + error result for every key.

:class:`FailureHandler` is a collaborator of :class:`~rewardq.consumers.worker.Worker`, like
:class:`~rewardq.consumers.commits.CommitCoalescer`: it is given the broker, the keyspace,
the worker's name and its counters, and does nothing else. Every failure ends in a visible,
explained state: a dead letter holding the raw entry, the reason, the traceback where there
is one, the delivery count and the worker; and an error result for every key of the
trajectory, so a waiting trainer is released.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rewardq.consumers.metrics import Metrics
from rewardq.queue.broker import Entry, StreamBroker
from rewardq.queue.codec import OutputRecord, peek_identity
from rewardq.queue.keys import Keyspace, trajectory_id

logger = logging.getLogger("rewardq.worker")

#: Largest piece of an oversize record kept in its dead letter.
DEAD_DATA_CAP = 65536


class FailureHandler:
    """Dead-lettering for one worker (see the module doc).

    Args:
        broker: the worker's gateway to Redis.
        ks: the pipeline's keyspace.
        worker_name: written into every dead letter.
        max_record_bytes: records larger than this keep only their first 64 KiB in the dead letter.
        stats: the worker's counters; ``dead_letters`` and ``errors`` are incremented here.
        metrics: the worker's metrics hooks.
    """

    def __init__(
        self,
        broker: StreamBroker,
        ks: Keyspace,
        *,
        worker_name: str,
        max_record_bytes: int,
        stats: dict[str, int],
        metrics: Metrics,
    ) -> None:
        self.broker = broker
        self.ks = ks
        self.worker_name = worker_name
        self.max_record_bytes = max_record_bytes
        self.stats = stats
        self.metrics = metrics

    async def dead_letter(
        self, entry: Entry, kind: str, reason: str, *, record: OutputRecord | None = None, tb: str = ""
    ) -> None:
        """Dead-letter one entry; if it names a trajectory, every key of it gets an error result."""
        ident = (record.uid, record.session_id, record.index) if record is not None else peek_identity(entry.data)
        dead = self._dead_fields(entry, kind, reason, tb)
        if ident is None:
            await self.broker.dead_letter_entry(entry, dead)
        else:
            uid, sid, idx = ident
            tid = trajectory_id(uid, sid)
            shard = self.ks.shard_of(tid)
            if shard != entry.shard:  # record routed to the wrong shard: answer on its own shard
                await self.broker.dead_letter_entry(entry, dead)
                await self.broker.fail(shard, tid, reason, index=idx, entry=None)
            else:
                await self.broker.fail(shard, tid, reason, index=idx, entry=entry, dead=dead)
        self._count(kind)
        logger.warning("dead-lettered entry %s (%s): %s", entry.id, kind, reason)

    async def fail_trajectory(self, shard: int, tid: str, entry: Entry, kind: str, reason: str, tb: str = "") -> None:
        """Fail a whole trajectory (scoring failed, or its stored records are bad)."""
        await self.broker.fail(
            shard, tid, reason, index=-1, entry=entry, dead=self._dead_fields(entry, kind, reason, tb, tid=tid)
        )
        self._count(kind)
        logger.warning("trajectory %s failed (%s): %s", tid, kind, reason)

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
