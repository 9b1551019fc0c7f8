"""The blocking Redis client the tests read with, typed by what it answers.

redis-py declares one class for blocking and asyncio use, so every reply of ``redis.Redis`` is typed
``Awaitable[Any] | Any``. rewardq states the replies of the commands it sends in
:class:`rewardq.queue.clients.SyncRedis`; :class:`SyncClient` adds the commands only the tests send
(a client made without ``decode_responses`` answers in bytes), and :func:`connect` is the one place
that turns a ``redis.Redis`` into one. A SyncClient is a SyncRedis, so it goes to rewardq's functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypedDict, cast

import redis
from redis.cluster import ClusterNode

from rewardq.queue.clients import Key, SyncRedis, Value


class PendingConsumer(TypedDict):
    name: bytes
    pending: int


class PendingSummary(TypedDict):
    """``XPENDING key group``: how many entries are delivered and not acknowledged, and to whom."""

    pending: int
    min: bytes | None
    max: bytes | None
    consumers: list[PendingConsumer]


Entry = tuple[bytes, dict[bytes, bytes]]
"""A stream entry: its id and its fields."""


class SyncClient(SyncRedis, Protocol):
    """A blocking ``redis.Redis`` (bytes replies): rewardq's commands and those the tests send too."""

    def keys(self, pattern: Key = "*") -> list[bytes]: ...
    def get(self, name: Key) -> bytes | None: ...
    def set(
        self, name: Key, value: Value, ex: int | None = None, px: int | None = None, nx: bool = False
    ) -> bool | None: ...
    def type(self, name: Key) -> bytes: ...
    def pttl(self, name: Key) -> int: ...
    def memory_usage(self, key: Key, samples: int | None = None) -> int | None: ...
    def expire(self, name: Key, time: int) -> bool: ...
    def hmget(self, name: Key, keys: Key | Sequence[Key], *args: Key) -> list[bytes | None]: ...
    def hexists(self, name: Key, key: Key) -> bool: ...
    def hset(
        self,
        name: Key,
        key: Key | None = None,
        value: Value | None = None,
        mapping: Mapping[Key, Value] | None = None,
    ) -> int: ...
    def zadd(self, name: Key, mapping: Mapping[str, float] | Mapping[bytes, float]) -> int: ...
    def zscore(self, name: Key, value: Key) -> float | None: ...
    def xpending(self, name: Key, groupname: Key) -> PendingSummary: ...
    def xack(self, name: Key, groupname: Key, *ids: Key) -> int: ...
    def xgroup_create(self, name: Key, groupname: Key, id: Key = "$", mkstream: bool = False) -> bool: ...
    def xgroup_destroy(self, name: Key, groupname: Key) -> int: ...
    def xreadgroup(
        self, groupname: Key, consumername: Key, streams: Mapping[Key, Key], count: int | None = None
    ) -> list[tuple[bytes, list[Entry]]]: ...
    def info(self, section: str | None = None) -> dict[str, Any]: ...  # INFO's fields: numbers and text
    def config_set(self, name: str, value: Value) -> bool: ...
    def slowlog_get(self, num: int | None = None) -> list[dict[str, Any]]: ...  # id, start_time, duration (µs), command
    def slowlog_reset(self) -> bool: ...
    def script_flush(self) -> bool: ...
    def flushdb(self) -> bool: ...  # only on a server a test started for itself
    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Any command; its reply's shape is the command's."""


class ClusterClient(SyncClient, Protocol):
    """A blocking ``redis.RedisCluster``: the commands above, routed by key, and its nodes."""

    def get_node_from_key(self, key: Key, replica: bool = False) -> ClusterNode: ...
    def get_primaries(self) -> list[ClusterNode]: ...
    def cluster_keyslot(self, key: Key) -> int: ...


def connect(url: str, **options: Any) -> SyncClient:
    """A blocking client for ``url`` (``options`` go to ``redis.Redis``), typed by its replies (see the
    module docstring)."""
    return cast(SyncClient, redis.Redis.from_url(url, **options))


def connect_cluster(host: str, port: int) -> ClusterClient:
    """A blocking cluster client through the node at ``host:port``, typed by its replies."""
    return cast(ClusterClient, redis.RedisCluster(host=host, port=port))


def connect_node(host: str, port: int) -> SyncClient:
    """A blocking client of one server (a cluster node, bypassing the cluster's routing)."""
    return cast(SyncClient, redis.Redis(host=host, port=port))
