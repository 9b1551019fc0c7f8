"""Large records travel in pieces: a producer writes a record over :data:`BLOB_CHUNK_BYTES` into a
**blob** (a hash of pieces of at most that size) and queues a small stream entry naming it.

Why: Redis runs one command at a time. An ``XADD`` of a 31 MB record, and the ``XREADGROUP`` that
delivers it, each held every other client for 80-250 ms on this machine kind (a fresh 31 MB
allocation and copy inside one command); the same bytes as 1 MiB ``HSET``/``HGET`` commands kept
another client's PING p99 near 20 ms (benchmarks/blob_latency.py). A blob's pieces are sent as
separate commands, never in a transaction, so other clients are served between them.

The entry of a blob record holds ``key``, ``ts``, ``blob`` (the blob's key, under
:meth:`~rewardq.queue.keys.Keyspace.blob_prefix` of the entry's shard), ``size`` and ``chunks``
instead of ``data``. A worker reads the pieces back one command at a time
(:func:`resolve_entries`) and hands on the entry with its ``data`` as if it had come inline.

Lifetime: a producer gives a blob ``blob_ttl`` (a put that fails deletes its blobs). ``store``
(``lua/store.lua``) names the blob in the trajectory hash (``b:<i>``) and removes its TTL when it
keeps the record by reference; the trajectory's end deletes it with its entry (``drop_refs`` in
``lua/common.lua``). A duplicate entry kept pending with a complete trajectory (listed in its
``acks``) has its blob listed beside it (``ack_blobs``), and every ending deletes both
(``ack_recorded``). A blob whose entry is dropped without being kept is deleted by ``store`` or by
the worker (:func:`delete_blobs`); the TTL bounds what a crash between the two leaves behind.

A large record reaches a worker's ``store`` the same way twice: a record over
``STORE_INLINE_BYTES`` (:mod:`rewardq.queue.broker`) is not copied into its trajectory's hash but
stays in its stream entry, which the hash names. :func:`kept_records` reads such records back for a
complete trajectory, entry by entry, and their blobs piece by piece as above.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rewardq.queue.entries import Entry
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import as_text

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis, Encodable, SyncRedis

#: The largest piece of a record one command carries; records larger than this travel as blobs.
BLOB_CHUNK_BYTES = 1024 * 1024
#: Seconds a blob lives unless a worker keeps its record (7 days: a backlog that old is lost anyway).
BLOB_TTL = 7 * 86400

_TOKEN = re.compile(rb"[0-9a-f]{32}")


def new_blob(ks: Keyspace, shard: int) -> str:
    """A fresh blob key in ``shard``'s hash slot."""
    return ks.blob(shard, secrets.token_hex(16))


def pieces(data: bytes) -> list[memoryview]:
    """``data`` cut into pieces of at most :data:`BLOB_CHUNK_BYTES` (no copy)."""
    view = memoryview(data)
    return [view[a : a + BLOB_CHUNK_BYTES] for a in range(0, len(view), BLOB_CHUNK_BYTES)]


def blob_fields(key: str, name: str, data: bytes, ts: str) -> dict[Encodable, Encodable]:
    """The stream entry's fields for a record sent as blob ``name``."""
    return {"key": key, "blob": name, "size": len(data), "chunks": len(pieces(data)), "ts": ts}


def write_blob(r: SyncRedis, name: str, data: bytes, ttl: int = BLOB_TTL) -> None:
    """Write ``data`` as blob ``name`` (piece by piece, no transaction), then give it ``ttl``."""
    pipe = r.pipeline(transaction=False)
    pipe.hset(name, "0", b"")  # made first, and given its TTL before any large piece lands
    pipe.expire(name, ttl)
    for i, piece in enumerate(pieces(data)):
        pipe.hset(name, str(i), piece)
    pipe.execute()


async def write_blob_async(r: AsyncRedis, name: str, data: bytes, ttl: int = BLOB_TTL) -> None:
    """:func:`write_blob` for an asyncio client."""
    pipe = r.pipeline(transaction=False)
    pipe.hset(name, "0", b"")  # type: ignore[arg-type]  # redis-py's stubs say str; it takes bytes
    pipe.expire(name, ttl)
    for i, piece in enumerate(pieces(data)):
        pipe.hset(name, str(i), piece)  # type: ignore[arg-type]  # and memoryviews
    await pipe.execute()


def blob_of(ks: Keyspace, entry: Entry) -> str | None:
    """The blob an entry names, when it names one of its own shard's (None otherwise: an entry
    naming any other key is refused by :func:`resolve_entries`, never read or deleted)."""
    raw = entry.fields.get(b"blob")
    if not isinstance(raw, bytes):
        return None
    prefix = ks.blob_prefix(entry.shard).encode()
    if raw.startswith(prefix) and _TOKEN.fullmatch(raw[len(prefix) :]):
        return raw.decode()
    return None


def _int_field(fields: Mapping[bytes, object], name: bytes) -> int | None:
    raw = fields.get(name, b"")
    try:
        return int(raw) if isinstance(raw, (bytes, str, int)) else None
    except ValueError:
        return None


def blob_size(fields: Mapping[bytes, object] | None) -> int:
    """The record bytes a blob entry's fields declare (0 for an entry without a blob)."""
    if not fields or b"blob" not in fields:
        return 0
    return max(0, _int_field(fields, b"size") or 0)


async def resolve_entries(r: AsyncRedis, ks: Keyspace, entries: Sequence[Entry], max_bytes: int) -> None:
    """Give each blob entry of ``entries`` its ``data``, read one piece per command.

    An entry with a bad or foreign ``blob`` name, a blob that is gone (expired or deleted), or a
    blob larger than ``max_bytes`` gets no ``data`` but a ``blob_error`` field saying why (the
    decoder turns it into the record's error). Reading stops past ``max_bytes``: a blob never
    costs the worker more than the record limit.
    """
    for e in entries:
        if b"blob" not in e.fields or b"data" in e.fields:
            continue
        name, size, chunks = blob_of(ks, e), _int_field(e.fields, b"size"), _int_field(e.fields, b"chunks")
        if name is None or size is None or chunks is None or chunks < 1:
            e.fields[b"blob_error"] = b"the entry's blob, size or chunks field is not one a producer writes"
            continue
        if size > max_bytes:
            e.fields[b"blob_error"] = f"size {size} bytes exceeds max_record_bytes={max_bytes}".encode()
            continue
        parts: list[bytes] = []
        got = 0
        for i in range(chunks):
            piece = await r.hget(name, str(i))  # type: ignore[misc]  # see rewardq.queue.clients
            if piece is None:
                break
            parts.append(piece)
            got += len(piece)
            if got > max_bytes:
                break
        if len(parts) < chunks or got != size:
            why = "is gone (expired after its blob_ttl, or deleted)" if not parts else f"holds {got} bytes, not {size}"
            e.fields[b"blob_error"] = f"the record's blob {name} {why}".encode()
            continue
        e.fields[b"data"] = b"".join(parts)


async def delete_blobs(r: AsyncRedis, ks: Keyspace, entries: Sequence[Entry]) -> None:
    """Delete the blobs of ``entries`` (entries a worker dropped without keeping their record)."""
    names = [n for n in (blob_of(ks, e) for e in entries) if n]
    for name in names:  # one key per call: a cluster client sends each to its own slot's node
        await r.delete(name)


async def kept_records(
    r: AsyncRedis, ks: Keyspace, replies: Sequence[tuple[int, Any]], max_bytes: int
) -> list[list[bytes | None]]:
    """The records of each ``complete`` store reply (``(shard, reply)``; empty for the others): its
    inline payloads, and the records it names by stream entry (``{entry_id}``) read from the stream
    with plain ``XRANGE`` calls in one round trip, their blobs resolved (:func:`resolve_entries`,
    within ``max_bytes``); None for an entry that is gone."""
    wanted: list[tuple[int, int, int, Any]] = []  # (reply, position, shard, entry id)
    got: list[list[bytes | None]] = []
    for i, (shard, reply) in enumerate(replies):
        values: list[bytes | None] = []
        for p, value in enumerate(reply[5:] if as_text(reply[0]) == "complete" else []):
            if isinstance(value, list):
                wanted.append((i, p, shard, value[0] if value else None))
                values.append(None)
            else:
                values.append(value)
        got.append(values)
    wanted = [w for w in wanted if w[3] is not None]
    if not wanted:
        return got
    pipe = r.pipeline(transaction=False)
    for _, _, shard, eid in wanted:
        pipe.xrange(ks.stream(shard), eid, eid)
    ranges = await pipe.execute()
    found = [Entry(shard, as_text(eid), e[0][1]) if e else None for (_, _, shard, eid), e in zip(wanted, ranges)]
    await resolve_entries(r, ks, [e for e in found if e is not None], max_bytes)
    for (i, p, _, _), entry in zip(wanted, found):
        got[i][p] = None if entry is None else entry.data
    return got
