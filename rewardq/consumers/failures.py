"""How a worker fails a record or a trajectory: dead letter + error result for every key.

A mixin of :class:`~rewardq.consumers.worker.Worker` (it uses the worker's ``broker``,
``ks``, ``cfg``, ``name``, ``stats`` and ``metrics``). Every failure ends in a visible,
explained state: a dead letter holding the raw entry, the reason, the traceback where there
is one, the delivery count and the worker; and an error result for every key of the
trajectory, so a waiting trainer is released.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rewardq.queue.broker import Entry
from rewardq.queue.codec import peek_identity
from rewardq.queue.keys import trajectory_id

logger = logging.getLogger("rewardq.worker")

#: Largest piece of an oversize record kept in its dead letter.
DEAD_DATA_CAP = 65536


class FailureHandling:
    """Dead-lettering for the worker (see the module doc)."""

    broker: Any
    ks: Any
    cfg: Any
    name: str
    stats: dict
    metrics: Any

    async def _dead_letter(self, entry: Entry, kind: str, reason: str, *, record: Any = None,
                           tb: str = "") -> None:
        """Dead-letter one entry; if it names a trajectory, every key of it gets an error result."""
        ident = (record.uid, record.session_id, record.index) if record is not None else peek_identity(entry.data)
        dead = self._dead_fields(entry, kind, reason, tb)
        if ident is None:
            await self.broker.dead_letter_entry(entry, dead)
        else:
            uid, sid, idx = ident
            tid = trajectory_id(uid, sid)
            shard = self.ks.shard_of(tid) if self.ks else entry.shard
            if shard != entry.shard:  # record routed to the wrong shard: answer on its own shard
                await self.broker.dead_letter_entry(entry, dead)
                await self.broker.fail(shard, tid, reason, index=idx, entry=None)
            else:
                await self.broker.fail(shard, tid, reason, index=idx, entry=entry, dead=dead)
        self._count_dead(kind)
        logger.warning("dead-lettered entry %s (%s): %s", entry.id, kind, reason)

    async def _fail(self, shard: int, tid: str, entry: Entry, kind: str, reason: str, tb: str = "") -> None:
        """Fail a whole trajectory (scoring failed, or its stored records are bad)."""
        await self.broker.fail(shard, tid, reason, index=-1, entry=entry,
                               dead=self._dead_fields(entry, kind, reason, tb, tid=tid))
        self._count_dead(kind)
        logger.warning("trajectory %s failed (%s): %s", tid, kind, reason)

    def _count_dead(self, kind: str) -> None:
        self.stats["dead_letters"] += 1
        self.stats["errors"] += 1
        if self.metrics is not None:
            self.metrics.dead_letter(kind)

    def _dead_fields(self, entry: Entry, kind: str, reason: str, tb: str, tid: str = "") -> dict[str, Any]:
        return {"entry_id": entry.id, "stream": self.ks.stream(entry.shard), "key": entry.key, "tid": tid,
                "kind": kind, "reason": reason[:4000], "traceback": tb[-8000:], "deliveries": entry.deliveries,
                "worker": self.name, "time": f"{time.time():.6f}", "ts": entry.fields.get(b"ts", b""),
                "data": self._dead_data(entry)}

    def _dead_data(self, entry: Entry) -> bytes:
        """The raw record kept in a dead letter; an oversize one is cut to its first 64 KiB."""
        data = entry.data if isinstance(entry.data, (bytes, bytearray)) else b""
        return bytes(data[:DEAD_DATA_CAP]) if len(data) > self.cfg.max_record_bytes else bytes(data)
