"""Connecting to Redis or Redis Cluster from a URL, with reconnect and backoff.

URLs:

* ``redis://[[user]:password@]host:6379/0`` — one Redis (ACL user and password in the URL);
* ``rediss://...`` — TLS; add ``?ssl_ca_certs=/path/ca.pem`` (and ``ssl_cert_reqs=none`` for a
  throwaway certificate);
* ``redis+cluster://host:7000`` (or ``rediss+cluster://``), or any URL with ``cluster=True`` —
  Redis Cluster; the other nodes are discovered from the one given.
* ``unix:///path/to/redis.sock`` — a local socket.

Passwords never reach logs: use :func:`redact_url` whenever a URL is printed. Every client
carries the one retry policy of :mod:`rewardq.queue.retry`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aredis

from rewardq import defaults
from rewardq.errors import RedisPermissionError
from rewardq.queue.clients import blocking
from rewardq.queue.retry import RETRY_ON, AsyncPolicyRetry, PolicyRetry

if TYPE_CHECKING:
    from rewardq.queue.clients import AnyRedis, AsyncRedis, SyncRedis

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


def _common(sync: bool) -> dict[str, Any]:
    """Connection settings every client shares; the retry policy is :mod:`rewardq.queue.retry`'s.

    Blocking clients wait at most ``SOCKET_TIMEOUT`` for a reply. asyncio clients set no reply
    timeout: with one, redis-py 5 sends each command through ``asyncio.wait_for``, which on
    Python 3.11 can swallow the cancellation of the calling task (CPython gh-86296), and a
    worker's tasks must stop when it is told to. A dead server is found by the connect timeout
    and TCP keepalive instead.
    """
    opts: dict[str, Any] = {
        "retry": PolicyRetry() if sync else AsyncPolicyRetry(),
        "retry_on_error": list(RETRY_ON),
        "socket_connect_timeout": defaults.SOCKET_CONNECT_TIMEOUT,
        "socket_keepalive": True,
        "health_check_interval": 30,
    }
    if sync:
        opts["socket_timeout"] = defaults.SOCKET_TIMEOUT
    return opts


#: Connections one client may open. Past it a command waits for a free connection (up to
#: ``pool_timeout`` seconds) instead of failing: many coroutines may share one asyncio client.
DEFAULT_MAX_CONNECTIONS = defaults.MAX_CONNECTIONS


def connect_async(url: str = DEFAULT_URL, *, cluster: bool = False, **kwargs: object) -> AsyncRedis:
    """An asyncio client (``redis.asyncio.Redis`` or ``RedisCluster``) for ``url``.

    The single-Redis client uses a *blocking* pool of ``max_connections`` (default 256): when
    every connection is busy a command waits ``pool_timeout`` (``defaults.POOL_TIMEOUT``) for one, where
    redis-py's default pool fails at once with "Too many connections".

    ``scripts_once=True`` (the worker's client) makes a cluster client try each call once
    (``cluster_error_retry_attempts=1``, which the broker's one-call pipelines obey), so that no
    Lua script is re-sent after a node failed under it (:mod:`rewardq.queue.retry`).
    """
    url, cluster = split_cluster(url, cluster)
    scripts_once = kwargs.pop("scripts_once", False)
    opts = {**_common(False), **kwargs}
    if cluster and scripts_once:
        opts["cluster_error_retry_attempts"] = 1
    if cluster:
        cluster_client: aredis.RedisCluster = aredis.RedisCluster.from_url(url, **_cluster_opts(opts))
        return cluster_client
    pool = aredis.BlockingConnectionPool.from_url(url, **_pool_opts(opts))
    return aredis.Redis.from_pool(pool)


def connect_sync(url: str = DEFAULT_URL, *, cluster: bool = False, **kwargs: object) -> SyncRedis:
    """A blocking client (``redis.Redis`` or ``redis.RedisCluster``) for ``url``."""
    url, cluster = split_cluster(url, cluster)
    opts = {**_common(True), **kwargs}
    client: redis.Redis | redis.RedisCluster
    if cluster:
        client = redis.RedisCluster.from_url(url, **_cluster_opts(opts))
    else:
        client = redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(url, **_pool_opts(opts)))
    return blocking(client)


def _cluster_opts(opts: dict[str, Any]) -> dict[str, Any]:
    """A cluster client's options: it has its own rules for MOVED and failover (see rewardq.queue.retry)."""
    opts.pop("health_check_interval", None)
    opts.pop("retry_on_error", None)
    return opts


def _pool_opts(opts: dict[str, Any]) -> dict[str, Any]:
    """A blocking pool's options: ``max_connections`` and ``pool_timeout`` become its size and wait."""
    opts["max_connections"] = opts.pop("max_connections", DEFAULT_MAX_CONNECTIONS)
    opts["timeout"] = opts.pop("pool_timeout", defaults.POOL_TIMEOUT)
    return opts


def is_cluster_client(client: AnyRedis) -> bool:
    return isinstance(client, (redis.RedisCluster, aredis.RedisCluster))


@contextlib.contextmanager
def refusals_named(namespace: str, url: str) -> Iterator[None]:
    """Inside, a command the Redis user may not run raises :func:`permission_error`'s one line
    instead of redis-py's ``NoPermissionError``."""
    try:
        yield
    except redis.exceptions.NoPermissionError as exc:
        raise permission_error(exc, namespace, url) from None


def client_user(client: AnyRedis) -> str:
    """The ACL user a client connects as (``default`` when it gives none)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None and hasattr(client, "get_default_node"):  # a cluster client: its nodes share the user
        node = client.get_default_node()
        pool = getattr(getattr(node, "redis_connection", None), "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    return str(kwargs.get("username") or "default")


def permission_error(exc: Exception, namespace: str, url: str, *, user: str | None = None) -> RedisPermissionError:
    """One line for a Redis ACL refusal (``NOPERM``): what was refused, and what to grant.
    ``user``: the ACL user, when the URL is not at hand (a producer's client)."""
    from urllib.parse import unquote, urlsplit

    user = user or unquote(urlsplit(split_cluster(url)[0]).username or "") or "default"
    detail = str(exc).strip() or type(exc).__name__
    detail = detail if detail.startswith("NOPERM") else f"NOPERM {detail}"  # redis-py drops the prefix
    return RedisPermissionError(
        f"Redis user {user!r} lacks a permission rewardq needs: {detail}. rewardq reads and writes the "
        f"keys '{namespace}:*' (key pattern ~{namespace}:*) with stream, hash, sorted-set, string and "
        f"script commands; grant them, e.g. ACL SETUSER {user} ~{namespace}:* +@read +@write +@stream "
        "+@hash +@sortedset +@string +@scripting +@connection +@keyspace +info"
    )
