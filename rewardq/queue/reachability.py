"""Whether Redis answers: probe it once, or wait for it with backoff, each failure said as what to try.

:func:`probe_redis` turns "connection refused" into a :class:`RedisUnavailable` whose message
names the (password-redacted) URL and says what to try, so the CLI can print one red line
instead of a traceback through five layers of redis-py. Every process that needs Redis before it
can start (``rewardq worker``, the supervisor, the operator commands, the demo) waits here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from rewardq.errors import RedisUnavailable
from rewardq.queue import connection as rx
from rewardq.queue.connection import connect_sync, redact_url, split_cluster
from rewardq.queue.retry import backoff_delay, no_retry

__all__ = ["probe_redis", "wait_for_redis"]

#: First and longest pause (seconds) between the start-up pings of a process waiting for Redis.
CONNECT_BACKOFF_BASE = 0.5
CONNECT_BACKOFF_CAP = 5.0
#: Seconds one start-up ping of Redis may take (connection and reply).
PROBE_TIMEOUT = 3.0


logger = logging.getLogger("rewardq.cli")


def probe_redis(url: str, *, cluster: bool = False, timeout: float = PROBE_TIMEOUT) -> None:
    """PING ``url`` once (no retries); raise :class:`RedisUnavailable` with a hint if that fails."""
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


#: How often a wait for Redis looks at its stop signal (seconds): a SIGTERM or Ctrl-C ends it this soon.
STOP_POLL_S = 0.1


def wait_for_redis(
    url: str,
    *,
    cluster: bool = False,
    timeout: float | None = None,
    stopping: Callable[[], str | None] | None = None,
) -> str | None:
    """:func:`probe_redis` until Redis answers, pausing by the retry policy's backoff (capped at 5 s).

    Logs one line per attempt window (what failed, how long it has waited, the next pause): the
    first with the whole hint of what to try, the later ones short, so a worker started before
    its Redis says what it is waiting for without repeating itself. ``timeout`` None waits
    forever; otherwise the last :class:`RedisUnavailable` is raised once ``timeout`` seconds have
    passed. Refused credentials and a bad URL fail at once.

    ``stopping`` (the name of a stop signal received, else None) is looked at every
    :data:`STOP_POLL_S`, during the pauses and during a probe (which runs in a daemon thread so
    that a connect or a name look-up that hangs cannot hold the process): once it names a
    signal, the wait logs that it stops and returns that name. Returns None when Redis answered.
    """
    start = time.monotonic()
    failures = 0
    shown = redact_url(url)
    while True:
        try:
            stopped = _probe(url, cluster, stopping)
            if stopped is None and failures:
                logger.info("redis at %s answers after %.1fs", shown, time.monotonic() - start)
        except RedisUnavailable as exc:
            if not exc.retryable:
                raise
            failures += 1
            waited = time.monotonic() - start
            if timeout is not None and waited >= timeout:
                raise RedisUnavailable(f"{exc} (waited {waited:.1f}s, --connect-timeout {timeout:g}s)") from None
            pause = backoff_delay(failures, base=CONNECT_BACKOFF_BASE, cap=CONNECT_BACKOFF_CAP)
            if timeout is not None:
                pause = min(pause, max(0.0, timeout - waited))
            _log_attempt(failures, waited, timeout, exc, pause, shown)
            stopped = _pause(pause, stopping)
            if stopped is None:
                continue
        if stopped is not None:
            logger.warning("%s received while waiting for Redis at %s; stopping", stopped, shown)
        return stopped


def _log_attempt(failures: int, waited: float, timeout: float | None, exc: Exception, pause: float, shown: str) -> None:
    """The first failed attempt says what failed and what to try; the later ones only how long it has been."""
    limit = "forever" if timeout is None else f"{timeout:g}s"
    if failures == 1:
        logger.warning("redis not reachable yet (attempt 1, waiting %s): %s; trying again in %.1fs", limit, exc, pause)
    else:
        logger.warning(
            "redis at %s still not reachable (attempt %d, waited %.1fs of %s); trying again in %.1fs",
            shown,
            failures,
            waited,
            limit,
            pause,
        )


def _probe(url: str, cluster: bool, stopping: Callable[[], str | None] | None) -> str | None:
    """:func:`probe_redis` once; with ``stopping``, in a daemon thread watched from here, returning
    the signal's name as soon as one is received (the abandoned probe ends at its own timeout)."""
    if stopping is None:
        probe_redis(url, cluster=cluster)
        return None
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def run() -> None:
        try:
            probe_redis(url, cluster=cluster)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread as it is
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="rewardq-redis-probe", daemon=True).start()
    while not done.wait(STOP_POLL_S):
        stopped = stopping()
        if stopped is not None:
            return stopped
    if outcome[0] is not None:
        raise outcome[0]
    return stopping()


def _pause(seconds: float, stopping: Callable[[], str | None] | None) -> str | None:
    """Sleep ``seconds``, looking at ``stopping`` every :data:`STOP_POLL_S`; the signal's name if one came."""
    end = time.monotonic() + seconds
    while True:
        stopped = stopping() if stopping is not None else None
        left = end - time.monotonic()
        if stopped is not None or left <= 0:
            return stopped
        time.sleep(min(left, STOP_POLL_S))
