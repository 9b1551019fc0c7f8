"""The one retry policy of rewardq: which Redis calls are sent again, how often, and for how long.

**Who retries.** Only the Redis connection does: every client rewardq builds
(:mod:`rewardq.queue.connection`) carries a :class:`PolicyRetry` (or its asyncio twin), and
redis-py runs every command and pipeline through it, re-sending on a fresh connection; opening a
connection, its handshake included, runs through it too (:mod:`rewardq.queue.handshake`). Nothing
above it loops over a failed command: when a call still fails, the caller's step fails, and the
at-least-once machinery recovers it (an unacknowledged entry stays pending and is reclaimed after
``claim_idle``; a producer's ``put_*`` raises). The worker's reader loop keeps reading after a
failed step, pausing by the same backoff (:func:`backoff_delay`), and a worker that starts while
Redis is down waits for it (``rewardq.queue.reachability.wait_for_redis``) up to ``--connect-timeout``.

**What is sent again.** A command that failed with a connection error or a timeout, with
exponential backoff and jitter (:data:`BASE` doubling up to :data:`CAP`), at most
:data:`RETRIES` times and never after :data:`DEADLINE` seconds from the first try (connection
attempts made inside the call count against the same deadline: the layers do not multiply). A
refused password fails at once.

**Scripts are special.** A Lua script runs atomically: while it runs, Redis answers nobody. A
script call (the broker marks them with :func:`script_call`) is sent again only when its failed
attempt came back within :data:`SCRIPT_RESEND_WINDOW` seconds with a connection error: then it
cannot have held Redis for longer than that (a restarted server, a dropped connection). It is
never sent again after a timeout (it may still be running), after a ``BUSY`` reply (Redis is
running a long script; redis-py does not treat it as retryable at all), or after an attempt that
took longer than the window (it may have blocked Redis). A script sent again may have run already
(its reply was lost with the connection), so every script the worker sends must be idempotent: the
commit is, the start counts of crash attribution count once per attempt (``lua/count.lua``), and
``fail`` and ``expire`` give a resend their first run's reply (:func:`~rewardq.queue.endings.call_nonce`).
``NOSCRIPT`` (the script is not loaded:
it did not run) is answered by loading it and sending it again, in
:meth:`~rewardq.queue.script_runner.ScriptRunner.run_many`. On Redis Cluster the worker's
client makes one attempt per script call (see :func:`~rewardq.queue.connection.connect_async`);
the cluster client refreshes its view of the slots after a failure.

**Worst case before a failure surfaces**, for one command: the deadline, :data:`DEADLINE` = 20 s,
plus the attempt that is running when it passes. When Redis is down (connections refused or
timing out after ``socket_connect_timeout``, 5 s) that is at most ~25 s. A blocking client also
bounds a reply by ``socket_timeout`` (30 s: at most ~50 s); an asyncio client sets none (see
:mod:`rewardq.queue.connection`), so a server that accepts a command and never answers is left to
TCP keepalive. A script call fails at once when its failed attempt took longer than
:data:`SCRIPT_RESEND_WINDOW` or timed out, else as for any command.

redis-py's own ``Retry`` is the hook: it is where a command can be re-sent on a fresh connection
for every client and every command, which a decorator library (tenacity, stamina) around our call
sites could not do without wrapping each of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from redis.asyncio.retry import Retry as _AsyncRetryBase
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as _SyncRetryBase

from rewardq.backoff import compute_backoff

T = TypeVar("T")

#: Re-sends of one command after its first try.
RETRIES = 8
#: First pause (seconds) before a re-send; it doubles with each failure, up to :data:`CAP`.
BASE = 0.1
#: Longest pause (seconds) between two tries.
CAP = 2.0
#: Seconds after the first try of a command past which it is not sent again.
DEADLINE = 20.0
#: A script attempt that failed within this many seconds is sent again; a slower one never is.
SCRIPT_RESEND_WINDOW = 1.0

#: Errors after which a command may be sent again (redis-py retries only the types it is given).
RETRY_ON: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, OSError)

_script: contextvars.ContextVar[bool] = contextvars.ContextVar("rewardq_script_call", default=False)
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("rewardq_retry_deadline", default=None)


@contextlib.contextmanager
def script_call() -> Iterator[None]:
    """Mark the Redis calls made inside as Lua script calls (see the module doc)."""
    token = _script.set(True)
    try:
        yield
    finally:
        _script.reset(token)


def backoff_delay(failures: int, *, base: float = BASE, cap: float = CAP) -> float:
    """The pause after the ``failures``-th failure in a row: ``min(cap, base * 2**(failures-1))``,
    with equal jitter (half fixed, half random) so that many clients do not reconnect in step
    (:func:`rewardq.backoff.compute_backoff`)."""
    return compute_backoff(failures, base=base, cap=cap, jitter=0.5)


def may_resend(error: BaseException, *, failures: int, attempt_s: float, deadline: float, script: bool) -> bool:
    """Whether a command whose attempt failed with ``error`` is sent again (the policy's one rule)."""
    if isinstance(error, AuthenticationError):
        return False  # a refused password: waiting will not change it
    if failures > RETRIES or time.monotonic() >= deadline:
        return False
    if script:
        if isinstance(error, RedisTimeoutError) or attempt_s >= SCRIPT_RESEND_WINDOW:
            return False  # it may still be running, or may have blocked Redis: never again
    return True


class _Tries:
    """Bookkeeping of one call: the shared deadline (the outermost call's) and the failures."""

    def __init__(self) -> None:
        self.own = _deadline.get() is None
        self.deadline = time.monotonic() + DEADLINE if self.own else float(_deadline.get() or 0)
        self.token = _deadline.set(self.deadline) if self.own else None
        self.failures = 0

    def close(self) -> None:
        if self.token is not None:
            _deadline.reset(self.token)

    def pause(self, error: BaseException, started: float) -> float | None:
        """The pause before the next try, or None when ``error`` must be raised."""
        self.failures += 1
        attempt_s = time.monotonic() - started
        if not may_resend(
            error, failures=self.failures, attempt_s=attempt_s, deadline=self.deadline, script=_script.get()
        ):
            return None
        return max(0.0, min(backoff_delay(self.failures), self.deadline - time.monotonic()))


class PolicyRetry(_SyncRetryBase):
    """redis-py's ``Retry`` (blocking clients) running :func:`may_resend` and :func:`backoff_delay`."""

    def __init__(self) -> None:
        super().__init__(NoBackoff(), RETRIES, supported_errors=RETRY_ON)

    def call_with_retry(
        self, do: Callable[[], T], fail: Callable[[Exception], object], *args: object, **kwargs: object
    ) -> T:
        tries = _Tries()
        try:
            while True:
                started = time.monotonic()
                try:
                    return do()
                except RETRY_ON as error:
                    fail(error)
                    pause = tries.pause(error, started)
                    if pause is None:
                        raise
                    time.sleep(pause)
        finally:
            tries.close()


class AsyncPolicyRetry(_AsyncRetryBase):
    """The asyncio twin of :class:`PolicyRetry`."""

    def __init__(self) -> None:
        super().__init__(NoBackoff(), RETRIES, supported_errors=RETRY_ON)  # type: ignore[arg-type]  # redis-py annotates RedisError types; OSError is retried too

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[[Any], Awaitable[object]],  # redis-py says RedisError; RETRY_ON adds OSError
        *args: object,
        **kwargs: object,
    ) -> T:
        tries = _Tries()
        try:
            while True:
                started = time.monotonic()
                try:
                    return await do()
                except RETRY_ON as error:
                    await fail(error)
                    pause = tries.pause(error, started)
                    if pause is None:
                        raise
                    await asyncio.sleep(pause)
        finally:
            tries.close()


def is_transient(exc: BaseException) -> bool:
    """Redis is away (connection lost or refused, timed out) or busy (``BUSY`` running a script,
    ``LOADING`` its data set, a cluster failing over): worth trying the step again after a pause.
    A refused password is not."""
    if isinstance(exc, AuthenticationError):
        return False
    if isinstance(exc, (*RETRY_ON, ConnectionError, TimeoutError, BusyLoadingError)):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(("BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN"))


def no_retry(sync: bool) -> object:
    """A redis-py ``Retry`` that never re-sends (probes that must answer quickly)."""
    return _SyncRetryBase(NoBackoff(), 0) if sync else _AsyncRetryBase(NoBackoff(), 0)
