"""Fleet-wide rate limiting: token buckets and leased concurrency slots, state in Redis.

Why: a paid judge API or an LLM-as-judge endpoint has *one* quota, but rewardq runs many
worker processes. verl keeps its limiters per process, so eight workers send eight times
the configured rate. :class:`FleetRateLimiter` keeps the state of one limiter in a single
Redis hash, so every process that names the same key shares the same budget.

The state lives in one Redis hash per limiter, changed by one Lua script
(:mod:`rewardq.reward.ratelimit.state`); this module holds the waiting, the leases and the counters.

Semantics:

* **Token buckets**, as verl's rate-limited manager keeps them: a bucket holds one second of
  the rate (``limit / 60``: 120 rpm is a bucket of 2 requests), refills continuously at
  ``limit / 60`` per second, and starts full. So 120 rpm is a smooth 2 requests/s with a
  burst of at most 2, across the whole fleet: the kind of traffic API providers accept,
  where a minute-sized bucket would let the fleet fire 120 requests at once.
* **Oversize requests.** A request costing more than the capacity cannot ever fit. Rather
  than stall forever it waits until the bucket is *full*, then goes and drives the level
  negative (debt). Later requests wait for the debt to be refilled, so the fleet's average
  rate still holds. (An oversize request can be overtaken by smaller ones while it waits
  for a full bucket; with the ``rate_limited`` manager every request has the same estimated
  cost, so that does not arise there.)
* **Concurrency slots** are leases: a holder owns ``s:<holder>`` until it releases it or
  its lease expires. Holders renew every ``lease_seconds / 3`` while they work, so a holder
  that is SIGKILLed frees its slot at most ``lease_seconds`` later. Expired slots are reaped
  by whoever asks for a slot next. Waiters poll, the interval growing from 20 ms to
  ``max_poll`` seconds; a release in this process wakes one of its waiters at once.
* **Atomicity and clock.** Every decision is one Lua script on one key (one hash slot, so
  it works on Redis Cluster) and reads the time with ``redis.call('TIME')``: all processes
  share the server's clock, whatever their own clocks say. The script never sleeps; it
  returns how long to wait, and the client sleeps that long (plus up to ``jitter`` of it,
  so a fleet of waiters does not retry in lock-step) and asks again, or sooner:
* **Tokens handed back are used.** A judge call reserves its estimate before it goes and hands
  back what it did not use when its answer arrives (:meth:`charge_tokens` with a negative count;
  a cancelled call hands back everything). Two rules keep those tokens in use:

  - *Credited whole.* A hand-back may lift the bucket past full, up to
    ``HAND_BACK_SECONDS`` (two) seconds of the rate; the refill still stops at one second. Clipped
    at full, a hand-back arriving on a bucket that had refilled meanwhile was mostly lost, and a
    call reserving a whole bucket could go only on a full one.
  - *Waiters wake.* The wait the script names counts only the refill. A hand-back in the waiter's
    own process rings a doorbell that wakes one waiter at once (which wakes the next when it got
    its share); one made by another process is found within about ``repoll`` seconds (50 ms),
    because a process's waiters never sleep longer than ``repoll`` times their number
    (:mod:`rewardq.reward.ratelimit.doorbell`: each process asks about 1/``repoll`` times a
    second while it has waiters, however many).

  Measured (tests/integration/test_ratelimit_handback.py: two processes of six callers, judge
  calls of 1 s, ``max_tpm`` 60,000, an estimate of 1,000 and a real use of 200, seconds 6 to 16 of
  the run): the limiter as it was gave the fleet 38 % of ``max_tpm``, waking alone 40 %, both
  rules 92 % (machine load about 16 on 2 cores). Averaged over any stretch of time the fleet uses
  no more than the rate; at once, at most two seconds of it (one before). verl's buckets never
  hand anything back (its manager charges the estimate, never the usage), so for
  ``rate_limited`` nothing changes.
* **Bounded debt.** Whatever a request is charged, a bucket's level never goes below
  ``-RATE_LIMIT_MAX_DEBT_SECONDS`` seconds of its rate (a minute: ``-max_tpm`` tokens), read or
  written, so no single charge (a judge's ``usage`` of 10**15 tokens) stops the fleet for longer
  than that; a cost that is not a finite number is refused before it reaches Redis.
* **Expiry.** The hash expires when it would hold nothing but full buckets and dead slots
  (time to refill any debt plus 60 s, at most about two minutes; or the lease plus 60 s), so idle
  limiters vanish.
* **Waits within the budget.** A caller scoring a trajectory under ``score_timeout`` never sleeps
  past what is left of it: when the limiter asks for a longer wait, :class:`RateLimitWait` says so
  at once (which limit, how long, how much was left), rather than the trajectory timing out later
  with nothing to say why.
* **Oversize requests, compared with verl.** verl charges an oversize request at once and
  makes its caller sleep until the debt is refilled; here the request waits for a full bucket,
  goes, and the debt delays whoever comes next. Both keep the average rate; neither stalls.

All processes naming one limiter should use the same limits; each call applies the limits
its caller was configured with.

:class:`LocalRateLimiter` has the same interface and semantics inside one process (state in
memory, ``time.monotonic`` as the clock). The ``rate_limited`` manager falls back to it when no
Redis is configured, e.g. for a single-process run.

Example::

    limiter = FleetRateLimiter(redis, Keyspace("rewardq").ratelimit("judge"),
                               max_rpm=500, max_tpm=100_000, max_concurrent=8)
    await limiter.acquire_request()
    await limiter.acquire_tokens(2000)
    async with limiter.slot():
        await call_the_judge()
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError, TransientError
from rewardq.queue.connection import connect_async
from rewardq.reward.ratelimit.bucket import RATE_LIMIT_MAX_DEBT_SECONDS, bucket_take
from rewardq.reward.ratelimit.doorbell import Doorbell
from rewardq.reward.ratelimit.state import LimiterState
from rewardq.reward.time_left import time_left

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis


#: Requests in flight across the fleet when a limiter is given no number (``rate_limited``'s
#: ``max_concurrent``, verl's default).
RATE_LIMITED_MAX_CONCURRENT = 1
#: Fleet-wide rate limiter: seconds a concurrency slot is held without renewal (a dead worker's
#: slot frees itself), the share of a wait drawn at random, and the longest single poll (seconds).
RATE_LIMIT_LEASE_SECONDS = 30.0
RATE_LIMIT_JITTER = 0.1
RATE_LIMIT_MAX_POLL = 0.5
#: Seconds a process's waiters for one bucket go, together, without asking it again: tokens another
#: process hands back are found within about this long (:mod:`rewardq.reward.ratelimit.doorbell`).
RATE_LIMIT_REPOLL = 0.05

logger = logging.getLogger("rewardq.reward.ratelimit")


class RateLimitWait(TransientError):
    """A call was not made because the rate limiter asked for a wait longer than what is left of
    the trajectory's ``score_timeout``: the limit, not the scorer, is what ran out of time
    (``transient``: the bucket refills; ``retry_after`` is the wait it asked for)."""


def _finite_cost(n: float) -> None:
    """A cost that is not a finite number never reaches a bucket (``inf`` would empty it, ``nan`` spoil it)."""
    if not math.isfinite(n):
        raise ValueError(f"a rate-limit cost must be a finite number of tokens, got {n!r}")


@dataclass
class WaitStats:
    """How often and how long callers waited for one kind of permission."""

    count: int = 0
    seconds: float = 0.0


class _LimiterBase:
    """The waiting loops, the slot context manager and the counters; subclasses hold the state."""

    def __init__(
        self,
        max_rpm: float | None = None,
        max_tpm: float | None = None,
        max_concurrent: int | None = RATE_LIMITED_MAX_CONCURRENT,
        lease_seconds: float = RATE_LIMIT_LEASE_SECONDS,
        *,
        jitter: float = RATE_LIMIT_JITTER,
        max_poll: float = RATE_LIMIT_MAX_POLL,
        repoll: float = RATE_LIMIT_REPOLL,
        holder_prefix: str | None = None,
    ) -> None:
        for name, value in (("max_rpm", max_rpm), ("max_tpm", max_tpm)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ConfigError(f"{name} must be a positive number or None (unlimited), got {value!r}")
        if max_concurrent is not None and (
            isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1
        ):
            raise ConfigError(f"max_concurrent must be an integer >= 1 or None (unlimited), got {max_concurrent!r}")
        if not isinstance(lease_seconds, (int, float)) or not lease_seconds > 0:
            raise ConfigError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        self.max_rpm = max_rpm
        self.max_tpm = max_tpm
        self.max_concurrent = max_concurrent
        self.lease_seconds = float(lease_seconds)
        self.jitter = jitter
        self.max_poll = max_poll
        self.repoll = repoll
        self.bells = {"request": Doorbell(), "tokens": Doorbell(), "slot": Doorbell()}
        self.holder_prefix = holder_prefix or f"{socket.gethostname()}:{os.getpid()}"
        self.waits = {"request": WaitStats(), "tokens": WaitStats(), "slot": WaitStats()}

    # -- what subclasses provide -------------------------------------------------------
    async def _take(
        self, bucket: str, capacity: float, cost: float, look: bool, charge: bool = False, hand_back: bool = False
    ) -> tuple[float, float]:
        raise NotImplementedError

    async def _slot_op(self, op: str, holder: str) -> float:
        """``slot`` -> seconds to wait (0 = held); ``renew``/``release`` -> 1.0 or 0.0."""
        raise NotImplementedError

    # -- non-blocking probes (also what the tests read) ------------------------------------
    async def try_request(self) -> float:
        """Take one request token if available: returns 0.0, or the seconds to wait (nothing taken)."""
        if self.max_rpm is None:
            return 0.0
        return (await self._take("rpm", self.max_rpm, 1.0, False))[0]

    async def try_tokens(self, n: float) -> float:
        """Take ``n`` tokens if allowed now (see the oversize rule): 0.0, or the seconds to wait."""
        _finite_cost(n)
        if self.max_tpm is None or n <= 0:
            return 0.0
        return (await self._take("tpm", self.max_tpm, float(n), False))[0]

    async def charge_tokens(self, n: float) -> float:
        """Charge ``n`` tokens now, whatever the level (the bucket may go into debt, at most
        ``RATE_LIMIT_MAX_DEBT_SECONDS`` of the rate, which later callers wait out): for a cost known
        only after the call, such as the tokens a judge server reports in its ``usage``. Returns the
        level after. Never waits. A negative ``n`` gives tokens back (what was reserved with
        :meth:`acquire_tokens` beyond what the call cost), credited whole up to ``HAND_BACK_SECONDS``
        of the rate, and wakes a waiter of this process for them. A cost that is not a finite number
        is a ``ValueError``."""
        _finite_cost(n)
        if self.max_tpm is None or n == 0:
            return 0.0
        level = (await self._take("tpm", self.max_tpm, float(n), False, charge=True, hand_back=n < 0))[1]
        if n < 0:
            self.bells["tokens"].ring()  # a waiter here uses them now (other processes: re-polls)
        return level

    async def give_back_request(self) -> None:
        """Return one request token (``max_rpm``) taken for a call that was never made or was
        aborted before its answer (its trajectory was cancelled). The bucket never holds more
        than it can: the level is capped again at its next read."""
        if self.max_rpm is not None:
            await self._take("rpm", self.max_rpm, -1.0, False, charge=True)
            self.bells["request"].ring()

    async def level(self, bucket: str) -> float | None:
        """The current level of ``"rpm"`` or ``"tpm"`` (None when that limit is off). Takes nothing."""
        cap = {"rpm": self.max_rpm, "tpm": self.max_tpm}[bucket]
        if cap is None:
            return None
        return (await self._take(bucket, cap, 0.0, True))[1]

    # -- blocking acquisition ----------------------------------------------------------
    async def acquire_request(self) -> float:
        """Wait for one request token (``max_rpm``). Returns the seconds spent waiting."""
        return await self._wait("request", self.try_request)

    async def acquire_tokens(self, n: float) -> float:
        """Wait for ``n`` tokens (``max_tpm``); see the module docstring for ``n`` above capacity."""
        if n < 0:
            raise ValueError(f"cannot acquire a negative number of tokens ({n})")
        return await self._wait("tokens", lambda: self.try_tokens(n))

    async def _wait(self, kind: str, attempt: Any) -> float:
        """Ask until ``attempt`` takes what it asks for: asleep between two questions for the wait the
        bucket names (plus jitter), or less: until a hand-back in this process rings ``kind``'s
        doorbell, and never longer than ``repoll`` times this process's sleepers of that kind (tokens
        handed back by another process; :mod:`~rewardq.reward.ratelimit.doorbell`).

        Returns the seconds the caller was held back: from the start of the first question that was
        refused to the answer that let it go, the questions included (a waiter asks again every
        ``repoll`` or so, and on a loaded machine or a distant Redis those round trips are a good
        part of the wait)."""
        bell, refused_at = self.bells[kind], None
        while True:
            since = bell.rings
            asked_at = time.monotonic()
            wait = await attempt()
            if wait <= 0:
                break
            refused_at = asked_at if refused_at is None else refused_at
            self._within_budget(kind, wait, time.monotonic() - refused_at)
            pause = min(
                wait * (1.0 + random.uniform(0.0, self.jitter)) + 0.001,
                self.repoll * (bell.sleeping + 1) * random.uniform(0.5, 1.5),
            )
            await bell.sleep(pause, since)
        if bell.sleeping:
            bell.ring()  # the next waiter looks at what is left
        return self._count_wait(kind, refused_at)

    def _count_wait(self, kind: str, refused_at: float | None) -> float:
        """Count one wait of ``kind`` that began when a question asked at ``refused_at`` was refused
        and ends now (None: the first question was granted, no wait); returns its seconds."""
        if refused_at is None:
            return 0.0
        waited = time.monotonic() - refused_at
        self.waits[kind].count += 1
        self.waits[kind].seconds += waited
        return waited

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[str | None]:
        """Hold one of ``max_concurrent`` slots for the duration of the block.

        Yields the holder id (None when concurrency is unlimited). The lease is renewed in
        the background every ``lease_seconds / 3``; the slot is released on exit, also on
        cancellation. If the holder dies, the slot frees itself when the lease runs out.
        """
        if self.max_concurrent is None:
            yield None
            return
        holder = f"{self.holder_prefix}:{uuid.uuid4().hex[:12]}"
        bell, poll, refused_at = self.bells["slot"], 0.02, None
        while True:
            since = bell.rings
            asked_at = time.monotonic()
            wait = await self._slot_op("slot", holder)
            if wait <= 0:
                break
            refused_at = asked_at if refused_at is None else refused_at
            pause = min(wait, poll) * (1.0 + random.uniform(0.0, self.jitter))
            poll = min(poll * 2, self.max_poll)
            self._within_budget("slot", pause, time.monotonic() - refused_at)
            await bell.sleep(pause, since)  # a release in this process wakes one waiter at once
        self._count_wait("slot", refused_at)
        renewer = asyncio.create_task(self._renew_loop(holder))
        try:
            yield holder
        finally:
            renewer.cancel()
            with suppress(asyncio.CancelledError):
                await renewer
            try:
                await asyncio.shield(self._slot_op("release", holder))
                bell.ring()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed release must not fail the call; the lease expiry frees the slot
                logger.warning(
                    "could not release rate-limit slot %s (%s); it frees itself in %.0fs",
                    holder,
                    exc,
                    self.lease_seconds,
                )

    async def _renew_loop(self, holder: str) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                if not await self._slot_op("renew", holder):
                    logger.warning(
                        "rate-limit slot %s expired before it was renewed (event loop blocked "
                        "for more than %.0fs?); the concurrency limit may be exceeded briefly",
                        holder,
                        self.lease_seconds,
                    )
                    return
            except Exception as exc:  # noqa: BLE001 - the renew loop outlives a failed renew; the lease is the fallback
                logger.warning("could not renew rate-limit slot %s: %s", holder, exc)

    def _within_budget(self, kind: str, wait: float, waited: float) -> None:
        """Raise :class:`RateLimitWait` when a wait of ``wait`` seconds would outlast what is left of
        the current trajectory's ``score_timeout`` (no trajectory being scored: no bound)."""
        left = time_left()
        if left is None or wait < left.seconds:
            return
        limit = {
            "request": f"max_rpm={self.max_rpm:g}" if self.max_rpm else "",
            "tokens": f"max_tpm={self.max_tpm:g}" if self.max_tpm else "",
            "slot": f"max_concurrent={self.max_concurrent}",
        }[kind]
        what = {"request": "a request token", "tokens": "tokens", "slot": "a free concurrency slot"}[kind]
        raise RateLimitWait(
            f"{self.describe()} ({limit}) holds the call back: it needs {wait:.1f}s more for {what} "
            f"(after {waited:.1f}s of waiting), and only {left.seconds:.1f}s are left of this "
            f"trajectory's score_timeout ({left.budget:g}s). The fleet is asking for more than the limit "
            "allows; raise the limit or score_timeout, or send fewer trajectories at once",
            retry_after=wait,
        )

    def describe(self) -> str:
        """What this limiter is, for messages."""
        return "this process's rate limiter"

    def stats(self) -> dict[str, dict[str, float]]:
        """Wait counters for metrics: ``{kind: {"waits": n, "wait_seconds": s}}``."""
        return {k: {"waits": v.count, "wait_seconds": v.seconds} for k, v in self.waits.items()}

    async def close(self) -> None:
        """Nothing to release by default (the Redis client belongs to the caller)."""


class FleetRateLimiter(_LimiterBase):
    """A limiter shared by every process that uses the same Redis ``key``.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` client (owned by the caller).
        key: the limiter's hash, normally ``Keyspace(ns).ratelimit(name)``.
        max_rpm: requests per minute, or None for no limit.
        max_tpm: tokens per minute, or None for no limit.
        max_concurrent: slots held at once across the fleet, or None for no limit.
        lease_seconds: how long a slot outlives a holder that stopped renewing it.
        jitter: each wait is stretched by a random 0..``jitter`` fraction.
        max_poll: the longest pause between two attempts to get a slot.
        holder_prefix: names the slot holders (default ``host:pid``).
    """

    def __init__(self, redis: AsyncRedis, key: str, *, owns_redis: bool = False, **limits: Any) -> None:
        super().__init__(**limits)
        self.state = LimiterState(redis, key, owns_redis=owns_redis)
        self.redis = redis
        self.key = key

    async def close(self) -> None:
        """Close the Redis client when it is the limiter's own (see :func:`open_limiter`)."""
        await self.state.close()

    def describe(self) -> str:
        return f"the fleet's rate limiter {self.key}"

    async def _take(
        self, bucket: str, capacity: float, cost: float, look: bool, charge: bool = False, hand_back: bool = False
    ) -> tuple[float, float]:
        return await self.state.take(bucket, capacity, cost, look, charge, RATE_LIMIT_MAX_DEBT_SECONDS, hand_back)

    async def _slot_op(self, op: str, holder: str) -> float:
        if op == "slot":
            return await self.state.slot(holder, self.max_concurrent or 0, self.lease_seconds)
        if op == "renew":
            return await self.state.renew(holder, self.lease_seconds)
        return await self.state.release(holder)


def open_limiter(redis_url: str | None, key: str, *, cluster: bool = False, **limits: object) -> _LimiterBase:
    """The limiter named by ``key``: fleet-wide on the pipeline's Redis at ``redis_url``, through a
    client of its own that :meth:`~FleetRateLimiter.close` closes; per process (a
    :class:`LocalRateLimiter`) when there is no Redis. ``limits`` as :class:`FleetRateLimiter` takes them.
    """
    if redis_url is None:
        return LocalRateLimiter(**limits)

    return FleetRateLimiter(connect_async(redis_url, cluster=cluster), key, owns_redis=True, **limits)


class LocalRateLimiter(_LimiterBase):
    """The same limiter for one process: state in memory, ``time.monotonic`` as the clock.

    Takes the same arguments as :class:`FleetRateLimiter` minus ``redis`` and ``key``.
    Limits hold only within this process; use it when there is no Redis to share state in.
    """

    def __init__(self, **limits: Any) -> None:
        super().__init__(**limits)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._slots: dict[str, float] = {}

    async def _take(
        self, bucket: str, capacity: float, cost: float, look: bool, charge: bool = False, hand_back: bool = False
    ) -> tuple[float, float]:
        now = time.monotonic()
        level, ts = self._buckets.get(bucket, (None, None))
        wait, after = bucket_take(level, ts, now, capacity, cost, look, charge, hand_back=hand_back)
        if not look:
            self._buckets[bucket] = (after, now)
        return wait, after

    async def _slot_op(self, op: str, holder: str) -> float:
        now = time.monotonic()
        if op == "release":
            return 1.0 if self._slots.pop(holder, None) is not None else 0.0
        if op == "renew":
            if holder not in self._slots:
                return 0.0
            self._slots[holder] = now + self.lease_seconds
            return 1.0
        for h, exp in list(self._slots.items()):
            if exp <= now:
                del self._slots[h]
        others = [exp for h, exp in self._slots.items() if h != holder]
        if holder in self._slots or len(others) < (self.max_concurrent or 0):
            self._slots[holder] = now + self.lease_seconds
            return 0.0
        return min(others) - now
