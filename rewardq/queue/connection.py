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
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
DEFAULT_URL = "redis://127.0.0.1:6379/0"


def redact_url(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user:***@host``; ``?password=secret`` -> ``?password=***``.

    A password holding a raw ``@`` is masked up to the last ``@`` of the host part, as
    the URL parser reads it.
    """
    url = re.sub(r"(://[^:/@?#]*:)[^/?#]*@", r"\1***@", url)
    url = re.sub(r"(://)([^:/@?#]+)@", r"\1***@", url)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


def split_cluster(url: str, cluster: bool = False) -> tuple[str, bool]:
    """Strip a ``+cluster`` scheme; returns the plain URL and whether it names a cluster."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in _CLUSTER_SCHEMES:
        return f"{_CLUSTER_SCHEMES[scheme]}://{rest}", True
    return url, cluster


#: Errors after which a command is sent again on a fresh connection (a restart, a dropped
#: connection, AOF still loading). redis-py retries a command only for the error types in
#: ``retry_on_error`` (empty by default), whatever the ``retry`` object says.
RETRY_ON = (RedisConnectionError, RedisTimeoutError, OSError)


class _SyncRetry(SyncRetry):
    """Retry with backoff, except that a refused password fails at once (no point in waiting)."""

    def call_with_retry(self, do: Any, fail: Any) -> Any:  # type: ignore[override]
        def fail_fast(error: Exception) -> None:
            fail(error)
            if isinstance(error, AuthenticationError):
                raise error

        return super().call_with_retry(do, fail_fast)


class _AsyncRetry(AsyncRetry):
    """The asyncio twin of :class:`_SyncRetry`."""

    async def call_with_retry(self, do: Any, fail: Any) -> Any:  # type: ignore[override]
        async def fail_fast(error: Exception) -> None:
            await fail(error)
            if isinstance(error, AuthenticationError):
                raise error

        return await super().call_with_retry(do, fail_fast)


def _retry(sync: bool) -> Any:
    cls = _SyncRetry if sync else _AsyncRetry
    return cls(ExponentialBackoff(cap=2.0, base=0.05), retries=8, supported_errors=RETRY_ON)


def _common(sync: bool) -> dict[str, Any]:
    return {
        "retry": _retry(sync),
        "retry_on_error": list(RETRY_ON),
        "socket_connect_timeout": 5,
        "socket_keepalive": True,
        "health_check_interval": 30,
    }


def connect_async(url: str = DEFAULT_URL, *, cluster: bool = False, **kwargs: Any) -> Any:
    """An asyncio client (``redis.asyncio.Redis`` or ``RedisCluster``) for ``url``."""
    url, cluster = split_cluster(url, cluster)
    opts = {**_common(False), **kwargs}
    if cluster:  # the cluster client has its own retry rules (MOVED, failover): left as they are
        opts.pop("health_check_interval", None)
        opts.pop("retry_on_error", None)
        return aredis.RedisCluster.from_url(url, **opts)
    return aredis.Redis.from_url(url, **opts)


def connect_sync(url: str = DEFAULT_URL, *, cluster: bool = False, **kwargs: Any) -> Any:
    """A blocking client (``redis.Redis`` or ``redis.RedisCluster``) for ``url``."""
    url, cluster = split_cluster(url, cluster)
    opts = {**_common(True), **kwargs}
    if cluster:  # the cluster client has its own retry rules (MOVED, failover): left as they are
        opts.pop("health_check_interval", None)
        opts.pop("retry_on_error", None)
        return redis.RedisCluster.from_url(url, **opts)
    return redis.Redis.from_url(url, **opts)


def is_cluster_client(client: Any) -> bool:
    return isinstance(client, (redis.RedisCluster, aredis.RedisCluster))
