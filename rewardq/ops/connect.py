"""Whether Redis answers: probe it once, or wait for it with backoff, each failure said as what to try.

:func:`probe_redis` turns "connection refused" into a :class:`RedisUnavailable` whose message
names the (password-redacted) URL and says what to try, so the CLI can print one red line
instead of a traceback through five layers of redis-py.
"""

from __future__ import annotations

import logging
import time

from rewardq import defaults
from rewardq.errors import RedisUnavailable
from rewardq.queue.connection import connect_sync, redact_url, split_cluster
from rewardq.queue.retry import backoff_delay, no_retry

__all__ = ["probe_redis", "wait_for_redis"]

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
        except (rx.RedisError, OSError):  # closing a client that never connected
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
