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

Code above ``queue/`` that must tell one Redis failure from another (the CLI's exit codes, the
operator commands, the worker's reader) names redis-py's exception types through this module
(``AuthenticationError`` ... ``TimeoutError`` below), so only ``queue/`` imports redis-py; and a
loop that rides out those failures asks :func:`being_cancelled` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aredis
from redis.exceptions import (
    AuthenticationError,
    ConnectionError,
    NoPermissionError,
    OutOfMemoryError,
    RedisError,
    ResponseError,
    TimeoutError,
)

from rewardq.errors import RedisPermissionError
from rewardq.queue.clients import blocking
from rewardq.queue.handshake import retried_handshakes
from rewardq.queue.packing import fast_packing
from rewardq.queue.retry import RETRY_ON, AsyncPolicyRetry, PolicyRetry

if TYPE_CHECKING:
    from rewardq.queue.clients import AnyRedis, AsyncRedis, SyncRedis

__all__ = [
    "REDIS_URL",
    "AuthenticationError",
    "ConnectionError",
    "NoPermissionError",
    "OutOfMemoryError",
    "RedisError",
    "ResponseError",
    "TimeoutError",
    "being_cancelled",
    "client_user",
    "connect_async",
    "connect_sync",
    "is_cluster_client",
    "is_out_of_memory",
    "is_refused_permission",
    "permission_error",
    "redact_url",
    "refusals_named",
    "split_cluster",
]

#: Where producers, workers and operator commands connect unless told otherwise.
REDIS_URL = "redis://127.0.0.1:6379/0"
#: Connections one client may open; past it a command waits for a free one.
MAX_CONNECTIONS = 256
#: Seconds a command waits for a free connection when all MAX_CONNECTIONS are busy.
POOL_TIMEOUT = 30.0
#: Seconds to wait for a TCP connection to Redis.
SOCKET_CONNECT_TIMEOUT = 5.0
#: Seconds a blocking client waits for the reply to one command (asyncio clients: see
#: ``rewardq.queue.connection``).
SOCKET_TIMEOUT = 30.0


_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_PIPELINE_NOTE = " of pipeline caused error: "


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a write because it is past ``maxmemory`` (an ``OOM`` reply:
    a command, or a script whose flags do not allow it, refused before it ran)."""
    if isinstance(exc, OutOfMemoryError):
        return True
    if not isinstance(exc, ResponseError) or not exc.args:
        return False
    text = str(exc.args[0])
    if _PIPELINE_NOTE in text:  # redis-py's pipeline error: the command (a record, say), then Redis's words
        text = text.rpartition(_PIPELINE_NOTE)[2].lstrip("('\" ")  # the asyncio client writes the args tuple
    return text.lstrip().upper().startswith(("OOM", "COMMAND NOT ALLOWED WHEN USED MEMORY"))


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


def _common(sync: bool) -> dict[str, object]:
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
        "socket_connect_timeout": SOCKET_CONNECT_TIMEOUT,
        "socket_keepalive": True,
        "health_check_interval": 30,
    }
    if sync:
        opts["socket_timeout"] = SOCKET_TIMEOUT
    return opts


#: Connections one client may open. Past it a command waits for a free connection (up to
#: ``pool_timeout`` seconds) instead of failing: many coroutines may share one asyncio client.


def connect_async(url: str = REDIS_URL, *, cluster: bool = False, **kwargs: object) -> AsyncRedis:
    """An asyncio client (``redis.asyncio.Redis`` or ``RedisCluster``) for ``url``.

    The single-Redis client packs commands in C (:mod:`rewardq.queue.packing`) and uses a
    *blocking* pool of ``max_connections`` (default 256): when every connection is busy a command
    waits ``pool_timeout`` (``POOL_TIMEOUT``) for one, where redis-py's default pool fails at once
    with "Too many connections".

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
    pool = fast_packing(aredis.BlockingConnectionPool.from_url(url, **_pool_opts(opts)))  # commands packed in C
    return aredis.Redis.from_pool(retried_handshakes(pool, sync=False))


def connect_sync(url: str = REDIS_URL, *, cluster: bool = False, **kwargs: object) -> SyncRedis:
    """A blocking client (``redis.Redis`` or ``redis.RedisCluster``) for ``url``."""
    url, cluster = split_cluster(url, cluster)
    opts = {**_common(True), **kwargs}
    client: redis.Redis | redis.RedisCluster
    if cluster:
        client = redis.RedisCluster.from_url(url, **_cluster_opts(opts))
    else:
        pool = redis.BlockingConnectionPool.from_url(url, **_pool_opts(opts))
        client = redis.Redis.from_pool(retried_handshakes(pool, sync=True))
    return blocking(client)


def _cluster_opts(opts: dict[str, object]) -> dict[str, object]:
    """A cluster client's options: it has its own rules for MOVED and failover (see rewardq.queue.retry)."""
    opts.pop("health_check_interval", None)
    opts.pop("retry_on_error", None)
    return opts


def _pool_opts(opts: dict[str, object]) -> dict[str, object]:
    """A blocking pool's options: ``max_connections`` and ``pool_timeout`` become its size and wait."""
    opts["max_connections"] = opts.pop("max_connections", MAX_CONNECTIONS)
    opts["timeout"] = opts.pop("pool_timeout", POOL_TIMEOUT)
    return opts


def is_cluster_client(client: AnyRedis) -> bool:
    return isinstance(client, (redis.RedisCluster, aredis.RedisCluster))


@contextlib.contextmanager
def refusals_named(namespace: str, url: str) -> Iterator[None]:
    """Inside, a command the Redis user may not run raises :func:`permission_error`'s one line
    instead of redis-py's ``NoPermissionError``."""
    try:
        yield
    except NoPermissionError as exc:
        raise permission_error(exc, namespace, url) from None


#: How Redis 7 words an ACL refusal of a command (or key) called from inside a Lua script: a plain
#: error reply without the ``NOPERM`` prefix, which redis-py raises as a ``ResponseError``.
_IN_SCRIPT = "The user executing the script can't"


def is_refused_permission(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a command or key to this ACL user: ``NOPERM`` from a
    command sent directly, or the same refusal of a call inside one of our scripts."""
    if isinstance(exc, NoPermissionError):
        return True
    return isinstance(exc, ResponseError) and _IN_SCRIPT in str(exc)


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
    detail = str(exc).strip().rstrip(".") or type(exc).__name__
    detail = detail if detail.startswith("NOPERM") else f"NOPERM {detail}"  # redis-py drops the prefix
    return RedisPermissionError(
        f"Redis user {user!r} lacks a permission rewardq needs: {detail}. rewardq reads and writes the "
        f"keys '{namespace}:*' (key pattern ~{namespace}:*) with stream, hash, sorted-set, string and "
        f"script commands; grant them, e.g. ACL SETUSER {user} ~{namespace}:* +@read +@write +@stream "
        "+@hash +@sortedset +@string +@scripting +@connection +@keyspace +info"
    )


def being_cancelled() -> bool:
    """True when the current task has been asked to stop.

    A loop that catches ``Exception`` to ride out Redis faults must check this: a client
    interrupted mid-command may turn the ``CancelledError`` into a connection error, and a
    loop that swallows it can never be stopped (an event loop then hangs at shutdown).
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return bool(cancelling()) if cancelling is not None else False
