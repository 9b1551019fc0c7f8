"""What a pipeline's processes settle before they serve: the shard count, and a worker's name.

``<ns>:meta`` holds the shard count (and the wire schema version and creation time); the
first producer or worker writes it and every later one must agree. A worker without a
configured name gets :func:`default_worker_name`, its consumer name in the group.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING

from rewardq.errors import ConfigError
from rewardq.queue.codec import SCHEMA_VERSION
from rewardq.queue.keys import Keyspace

if TYPE_CHECKING:
    from redis.lock import Lock

    from rewardq.queue.clients import AsyncRedis, SyncRedis


async def ensure_meta(client: AsyncRedis, ks: Keyspace, shards: int | None) -> int:
    """Agree on the shard count through ``<ns>:meta``; returns the pipeline's shard count.

    The first producer or worker writes it; later ones must ask for the same or nothing.
    """
    want = shards or 1
    # redis-py types asyncio hash commands as blocking ones (rewardq.queue.clients)
    await client.hsetnx(ks.meta, "shards", str(want))  # type: ignore[misc]
    await client.hsetnx(ks.meta, "schema", str(SCHEMA_VERSION))  # type: ignore[misc]
    await client.hsetnx(ks.meta, "created_at", f"{time.time():.3f}")  # type: ignore[misc]
    have = int(await client.hget(ks.meta, "shards"))  # type: ignore[misc]
    if shards is not None and have != shards:
        raise ConfigError(
            f"namespace {ks.namespace!r} already uses shards={have}, but shards={shards} "
            "was asked for; use the same value everywhere (or a new namespace)"
        )
    return have


def default_worker_name() -> str:
    """``<host>-<pid>-<random>``: unique per process, readable in ``rewardq status``."""
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(2).hex()}"


def known_shards(client: SyncRedis, namespace: str) -> int | None:
    """The shard count ``<namespace>:meta`` holds, or None for a namespace nobody has used yet."""
    raw = client.hget(Keyspace(namespace).meta, "shards")
    return int(raw) if raw is not None else None


def try_lock(client: SyncRedis, ks: Keyspace, name: str, ttl: float) -> Lock | None:
    """Take ``<ns>:lock:<name>`` for at most ``ttl`` seconds without waiting: the held lock (its
    ``release()`` frees it only if it is still ours), or None when another process holds it.
    redis-py's :class:`redis.lock.Lock` (a token checked by a Lua script) does the work."""
    lock = client.lock(ks.lock(name), timeout=ttl, blocking=False)
    return lock if lock.acquire() else None
