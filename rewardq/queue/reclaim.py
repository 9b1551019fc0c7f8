"""Taking over what dead workers left pending: the worker's ``reclaim`` step.

:class:`~rewardq.queue.broker.StreamBroker` holds one :class:`Reclaimer` and hands
:meth:`~rewardq.queue.broker.StreamBroker.reclaim` to it. Entries are read with plain ``XRANGE``
within a byte budget, those of trajectories still leased to a live worker are skipped
(``lua/claimable.lua``), and the rest are claimed with ``XCLAIM ... JUSTID``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.typing import StreamIdT

from rewardq.queue.blobs import blob_size
from rewardq.queue.entries import Entry
from rewardq.queue.keys import MAX_KEY_BYTES, Keyspace
from rewardq.queue.results import as_text
from rewardq.queue.script_runner import ScriptRunner

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

#: Bytes of pending entries one reclaim pass reads before it leaves the rest for a later pass.
CLAIMABLE_BYTE_BUDGET = 64 * 1024 * 1024
#: Pending entries one round trip of a reclaim pass reads (``XRANGE`` each).
_RECLAIM_READS = 16

_s = as_text
_OUTPUT_KEY = re.compile(rb"(.+)_[0-9]+", re.DOTALL)


@dataclass
class Reclaimer:
    """Reclaims idle pending entries of one shard's stream for the consumer ``worker``."""

    r: AsyncRedis
    ks: Keyspace
    scripts: ScriptRunner
    worker: str

    async def reclaim(self, shard: int, min_idle_ms: int, count: int, trajectories: int | None = None) -> list[Entry]:
        """Take over entries other (dead) workers left pending for ``min_idle_ms``.

        ``count`` pending entries are looked at; of those that may be claimed, only the entries of
        the first ``trajectories`` trajectories (None: all) are, so the caller takes no more than
        it has room for (an entry that names no trajectory counts as one).

        The entries are read with plain ``XRANGE`` (at most ``CLAIMABLE_BYTE_BUDGET`` bytes in one
        pass, and one entry more; the rest wait for the next pass), entries of trajectories still
        leased to another worker are skipped (``lua/claimable.lua``, which reads no entry), so a
        dead worker's lease running out costs no deliveries, and the others are claimed with
        ``XCLAIM ... JUSTID`` (no record sent twice), their delivery count raised by one.

        Returns the claimed entries, each with its delivery count (the caller dead-letters
        those delivered more than ``max_deliveries`` times).
        """
        stream = self.ks.stream(shard)
        pending = await self.r.xpending_range(stream, self.ks.group, min="-", max="+", count=count, idle=min_idle_ms)
        if not pending:
            return []
        counts = {_s(p["message_id"]): int(p["times_delivered"]) for p in pending}
        found = await self._pending_entries(stream, list(counts))
        tids = {eid: _tid_named(fields) for eid, fields in found.items()}
        pairs: list[Any] = [v for eid, tid in tids.items() for v in (eid, tid)]
        args = [self.ks.traj_prefix(shard), self.worker, self.ks.group, *pairs]
        claimable = [_s(i) for i in await self.scripts.run("claimable", [stream], args)]
        if trajectories is not None:
            claimable = first_trajectories(claimable, tids, trajectories)
        if not claimable:
            return []
        by_count: dict[int, list[StreamIdT]] = {}
        for eid in claimable:
            by_count.setdefault(counts.get(eid, 0) + 1, []).append(eid)
        pipe = self.r.pipeline(transaction=False)
        for deliveries, ids in by_count.items():
            pipe.xclaim(stream, self.ks.group, self.worker, min_idle_ms, ids, retrycount=deliveries, justid=True)
        claimed = {_s(eid) for got in await pipe.execute() for eid in got or []}
        return [
            Entry(shard, eid, fields, deliveries=counts.get(eid, 0) + 1)
            for eid, fields in found.items()
            if eid in claimed and fields is not None
        ]

    async def _pending_entries(self, stream: str, ids: list[str]) -> dict[str, dict[bytes, Any] | None]:
        """The fields of the entries ``ids`` (None: deleted), read with ``XRANGE`` a few at a time,
        until they total ``CLAIMABLE_BYTE_BUDGET`` bytes."""
        out: dict[str, dict[bytes, Any] | None] = {}
        read = 0
        for at in range(0, len(ids), _RECLAIM_READS):
            if read >= CLAIMABLE_BYTE_BUDGET:
                break
            pipe = self.r.pipeline(transaction=False)
            for eid in ids[at : at + _RECLAIM_READS]:
                pipe.xrange(stream, eid, eid)
            for eid, got in zip(ids[at : at + _RECLAIM_READS], await pipe.execute()):
                fields = got[0][1] if got else None
                out[eid] = fields
                read += sum(len(k) + len(v) for k, v in (fields or {}).items() if isinstance(v, (bytes, str)))
                read += blob_size(fields)  # a blob's record is read when the entry is claimed
        return out


def first_trajectories(ids: list[str], tids: Mapping[str, bytes], n: int) -> list[str]:
    """The ``ids`` (in order) of the first ``n`` trajectories ``tids`` names; an id that names
    none (``b""``) is a trajectory of its own."""
    seen: set[tuple[bytes, str]] = set()
    out: list[str] = []
    for eid in ids:
        tid = tids.get(eid, b"")
        trajectory = (tid, "" if tid else eid)
        if trajectory not in seen:
            if len(seen) >= n:
                continue
            seen.add(trajectory)
        out.append(eid)
    return out


def _tid_named(fields: Mapping[bytes, Any] | None) -> bytes:
    """The trajectory an entry's ``key`` field names (``<tid>_<index>``), or '' (no entry, no such
    field, or a key longer than ``MAX_KEY_BYTES``: its entry is claimable, and filing it fails), as
    the bytes the trajectory's keys are built from."""
    key = (fields or {}).get(b"key")
    if not isinstance(key, bytes) or len(key) > MAX_KEY_BYTES:
        return b""
    named = _OUTPUT_KEY.fullmatch(key)
    return named.group(1) if named else b""
