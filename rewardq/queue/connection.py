"""Connecting to Redis or Redis Cluster from a URL, with reconnect and backoff.

URLs:

* ``redis://[[user]:password@]host:6379/0`` — one Redis (ACL user and password in the URL);
* ``rediss://...`` — TLS; add ``?ssl_ca_certs=/path/ca.pem`` (and ``ssl_cert_reqs=none`` for a
  throwaway certificate);
* ``redis+cluster://host:7000`` (or ``rediss+cluster://``), or any URL with ``cluster=True`` —
  Redis Cluster; the other nodes are discovered from the one given.
* ``unix:///path/to/redis.sock`` — a local socket.

Passwords never reach logs: use :func:`redact_url` whenever a URL is printed.
"""

from __future__ import annotations

import re
from typing import Any

import redis
import redis.asyncio as aredis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
DEFAULT_URL = "redis://127.0.0.1:6379/0"


def redact_url(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user:***@host``."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", re.sub(r"(://)([^:/@]+)@", r"\1***@", url))


def split_cluster(url: str, cluster: bool = False) -> tuple[str, bool]:
    """Strip a ``+cluster`` scheme; returns the plain URL and whether it names a cluster."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in _CLUSTER_SCHEMES:
        return f"{_CLUSTER_SCHEMES[scheme]}://{rest}", True
    return url, cluster


def _retry(sync: bool) -> Any:
    if sync:
        from redis.retry import Retry
    else:
        from redis.asyncio.retry import Retry  # type: ignore[no-redef]
    return Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=8,
                 supported_errors=(RedisConnectionError, RedisTimeoutError, ConnectionError, OSError))


def _common(sync: bool) -> dict[str, Any]:
    return {
        "retry": _retry(sync),
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        "health_check_interval": 30,
    }


def connect_async(url: str = DEFAULT_URL, *, cluster: bool = False, **kwargs: Any) -> Any:
    """An asyncio client (``redis.asyncio.Redis`` or ``RedisCluster``) for ``url``."""
    url, cluster = split_cluster(url, cluster)
    opts = {**_common(False), **kwargs}
    if cluster:
        opts.pop("health_check_interval", None)
        return aredis.RedisCluster.from_url(url, **opts)
    return aredis.Redis.from_url(url, **opts)


def connect_sync(url: str = DEFAULT_URL, *, cluster: bool = False, **kwargs: Any) -> Any:
    """A blocking client (``redis.Redis`` or ``redis.RedisCluster``) for ``url``."""
    url, cluster = split_cluster(url, cluster)
    opts = {**_common(True), **kwargs}
    if cluster:
        opts.pop("health_check_interval", None)
        return redis.RedisCluster.from_url(url, **opts)
    return redis.Redis.from_url(url, **opts)


def is_cluster_client(client: Any) -> bool:
    return isinstance(client, (redis.RedisCluster, aredis.RedisCluster))
