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
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rewardq.queue.keys import Keyspace

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis, Encodable, SyncRedis
    from rewardq.queue.entries import Entry

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
