"""Small pieces the commands share: checking Redis is reachable, removing a namespace.

:func:`probe_redis` turns "connection refused" into a :class:`RedisUnavailable` whose message
names the (password-redacted) URL and says what to try, so the CLI can print one red line
instead of a traceback through five layers of redis-py.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

from rewardq import defaults
from rewardq.errors import RedisUnavailable
from rewardq.queue.connection import connect_sync, redact_url, split_cluster
from rewardq.queue.retry import backoff_delay, no_retry

if TYPE_CHECKING:
    from rewardq.producers.client import RewardClient
    from rewardq.queue.clients import SyncRedis

__all__ = ["probe_redis", "wait_for_redis", "delete_namespace", "delete_trajectory_keys", "namespace_key_count"]

logger = logging.getLogger("rewardq.cli")


def probe_redis(url: str, *, cluster: bool = False, timeout: float = defaults.PROBE_TIMEOUT) -> None:
    """PING ``url`` once (no retries); raise :class:`RedisUnavailable` with a hint if that fails."""
    import rewardq.queue.redis_errors as rx

    shown = redact_url(url)
    _, is_cluster = split_cluster(url, cluster)
    try:
        client = connect_sync(
            url, cluster=cluster, retry=no_retry(sync=True), socket_connect_timeout=timeout, socket_timeout=timeout
        )
    except (ValueError, rx.RedisError) as exc:
        raise RedisUnavailable(
            f"cannot use Redis URL {shown}: {exc}. Expected redis://[user:password@]host:port/db, "
            "rediss://... for TLS or redis+cluster://host:port"
        ) from None
    try:
        client.ping()
    except rx.AuthenticationError as exc:
        raise RedisUnavailable(
            f"Redis at {shown} refused the credentials ({exc}); put the right user and "
            "password in the URL: redis://user:password@host:port/0"
        ) from None
    except (rx.ConnectionError, rx.TimeoutError, OSError) as exc:
        kind = "Redis Cluster" if is_cluster else "Redis"
        err = RedisUnavailable(
            f"cannot connect to {kind} at {shown} ({exc}). Is the server running and "
            "reachable from here? Start one with `redis-server`, pass --redis-url, or try "
            "`rewardq demo` without --redis-url for a self-contained run"
        )
        err.retryable = True
        raise err from None
    except rx.ResponseError as exc:
        raise RedisUnavailable(f"Redis at {shown} answered PING with an error: {exc}") from None
    finally:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - closing a client that never connected
            pass


def wait_for_redis(url: str, *, cluster: bool = False, timeout: float | None = None) -> None:
    """:func:`probe_redis` until Redis answers, pausing by the retry policy's backoff (capped at 5 s).

    Logs one line per attempt window (what failed, how long it has waited, the next pause), so a
    worker started before its Redis says what it is waiting for. ``timeout`` None waits forever;
    otherwise the last :class:`RedisUnavailable` is raised once ``timeout`` seconds have passed.
    Refused credentials and a bad URL fail at once.
    """
    start = time.monotonic()
    failures = 0
    while True:
        try:
            probe_redis(url, cluster=cluster)
            if failures:
                logger.info("redis at %s answers after %.1fs", redact_url(url), time.monotonic() - start)
            return
        except RedisUnavailable as exc:
            if not exc.retryable:
                raise
            failures += 1
            waited = time.monotonic() - start
            if timeout is not None and waited >= timeout:
                raise RedisUnavailable(f"{exc} (waited {waited:.1f}s, --connect-timeout {timeout:g}s)") from None
            pause = backoff_delay(failures, base=defaults.CONNECT_BACKOFF_BASE, cap=defaults.CONNECT_BACKOFF_CAP)
            if timeout is not None:
                pause = min(pause, max(0.0, timeout - waited))
            logger.warning(
                "redis not reachable yet (attempt %d, waited %.1fs of %s): %s; trying again in %.1fs",
                failures,
                waited,
                "forever" if timeout is None else f"{timeout:g}s",
                exc,
                pause,
            )
            time.sleep(pause)


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _scan(client: SyncRedis, pattern: str) -> list[bytes]:
    keys: list[bytes] = []
    for key in client.scan_iter(match=pattern, count=1000):
        keys.append(key)
    return keys


def namespace_key_count(client: SyncRedis, namespace: str) -> int:
    """How many keys live under ``<namespace>:`` (SCAN; fine for demos and tests)."""
    return len(_scan(client, _glob_escape(namespace) + ":*"))


def delete_namespace(client: SyncRedis, namespace: str) -> int:
    """Delete every key under ``<namespace>:``; returns how many. Never touches other keys."""
    keys = _scan(client, _glob_escape(namespace) + ":*")
    deleted = 0
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        if getattr(client, "get_nodes", None) is not None:  # cluster: keys live in many slots
            for k in chunk:
                deleted += int(client.delete(k))
        else:
            deleted += int(client.delete(*chunk))
    return deleted


def delete_trajectory_keys(client: RewardClient, keys: list[str]) -> int:
    """Delete the result hashes of ``keys`` and their trajectories' hashes, nothing else.

    ``client`` is a :class:`~rewardq.producers.client.RewardClient`; used when the namespace
    is shared with other work (``rewardq demo --workers 0``).
    """
    ks = client.keyspace
    targets = sorted({ks.reward_key(k) for k in keys} | {ks.traj_key(k.rpartition("_")[0]) for k in keys})
    deleted = 0
    for i in range(0, len(targets), 500):
        pipe = client.r.pipeline(transaction=False)
        for key in targets[i : i + 500]:
            pipe.delete(key)
        deleted += sum(int(n) for n in pipe.execute())
    return deleted
