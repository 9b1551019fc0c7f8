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

from rewardq import defaults

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
DEFAULT_URL = defaults.REDIS_URL


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
    """Retry with backoff, except that a refused password fails at once (no point in waiting).

    The extra arguments redis-py passes (``is_retryable``, ``with_failure_count`` in redis-py 6+,
    where ``fail`` then takes ``(error, failures)``) are passed through untouched.
    """

    def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        def fail_fast(error: Exception, *rest: Any) -> None:
            fail(error, *rest)
            if isinstance(error, AuthenticationError):
                raise error

        return super().call_with_retry(do, fail_fast, *args, **kwargs)


class _AsyncRetry(AsyncRetry):
    """The asyncio twin of :class:`_SyncRetry`."""

    async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        async def fail_fast(error: Exception, *rest: Any) -> None:
            await fail(error, *rest)
            if isinstance(error, AuthenticationError):
                raise error

        return await super().call_with_retry(do, fail_fast, *args, **kwargs)


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


#: Connections one client may open. Past it a command waits for a free connection (up to
#: ``pool_timeout`` seconds) instead of failing: many coroutines may share one asyncio client.
DEFAULT_MAX_CONNECTIONS = defaults.MAX_CONNECTIONS


def connect_async(url: str = DEFAULT_URL, *, cluster: bool = False, **kwargs: Any) -> Any:
    """An asyncio client (``redis.asyncio.Redis`` or ``RedisCluster``) for ``url``.

    The single-Redis client uses a *blocking* pool of ``max_connections`` (default 256): when
    every connection is busy a command waits ``pool_timeout`` (default 30 s) for one, where
    redis-py's default pool fails at once with "Too many connections".
    """
    url, cluster = split_cluster(url, cluster)
    opts = {**_common(False), **kwargs}
    if cluster:  # the cluster client has its own retry rules (MOVED, failover): left as they are
        opts.pop("health_check_interval", None)
        opts.pop("retry_on_error", None)
        return aredis.RedisCluster.from_url(url, **opts)
    pool = aredis.BlockingConnectionPool.from_url(
        url,
        max_connections=opts.pop("max_connections", DEFAULT_MAX_CONNECTIONS),
        timeout=opts.pop("pool_timeout", 30),
        **opts,
    )
    return aredis.Redis.from_pool(pool)


def connect_sync(url: str = DEFAULT_URL, *, cluster: bool = False, **kwargs: Any) -> Any:
    """A blocking client (``redis.Redis`` or ``redis.RedisCluster``) for ``url``."""
    url, cluster = split_cluster(url, cluster)
    opts = {**_common(True), **kwargs}
    if cluster:  # the cluster client has its own retry rules (MOVED, failover): left as they are
        opts.pop("health_check_interval", None)
        opts.pop("retry_on_error", None)
        return redis.RedisCluster.from_url(url, **opts)
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=opts.pop("max_connections", DEFAULT_MAX_CONNECTIONS),
        timeout=opts.pop("pool_timeout", 30),
        **opts,
    )
    return redis.Redis.from_pool(pool)


def is_cluster_client(client: Any) -> bool:
    return isinstance(client, (redis.RedisCluster, aredis.RedisCluster))
