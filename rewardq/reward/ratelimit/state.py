"""A fleet rate limiter's state in Redis: one hash per limiter, changed only by one Lua script.

What one limiter holds (one HASH, ``<ns>:ratelimit:<name>``, see :mod:`rewardq.queue.keys`)::

    b:rpm:tokens  b:rpm:ts     request bucket: level and the server time it was computed at
    b:tpm:tokens  b:tpm:ts     token bucket (same layout)
    s:<holder>                 one concurrency slot: the server time its lease expires

Every decision is one call of ``ratelimit.lua`` (beside this module) on that one key (one hash slot, so it works
on Redis Cluster), which reads the time with ``redis.call('TIME')`` and never sleeps: it returns
how long to wait. The hash expires when it would hold nothing but full buckets and dead slots.
The waiting, the leases and the counters are :mod:`rewardq.reward.ratelimit.limiter`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewardq.queue import scripts
from rewardq.queue.retry import script_call

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis


class LimiterState:
    """The script calls on one limiter's hash.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` client.
        key: the limiter's hash, normally ``Keyspace(ns).ratelimit(name)``.
        owns_redis: :meth:`close` closes ``redis`` (a client made for this limiter).
    """

    def __init__(self, redis: AsyncRedis, key: str, *, owns_redis: bool = False) -> None:
        self.redis = redis
        self.key = key
        self.owns_redis = owns_redis
        self._script = redis.register_script(scripts.feature_source("rewardq.reward.ratelimit", "ratelimit"))  # type: ignore[misc]  # redis-py's asyncio RedisCluster.register_script is typed for Redis only; it has one

    async def take(
        self,
        bucket: str,
        capacity: float,
        cost: float,
        look: bool,
        charge: bool,
        max_debt_seconds: float,
        hand_back: bool = False,
    ) -> tuple[float, float]:
        """The token-bucket rule on ``bucket``: ``(wait, level_after)`` (see ``bucket_take``); the level
        never goes below ``-max_debt_seconds`` of the rate."""
        mode = "3" if charge and hand_back else "2" if charge else "1" if look else "0"
        args = ["take", bucket, repr(float(capacity)), repr(float(cost)), mode, repr(float(max_debt_seconds))]
        wait, level = await self._run(args)
        return float(wait), float(level)

    async def slot(self, holder: str, max_concurrent: int, lease_seconds: float) -> float:
        """Take or extend ``holder``'s slot: 0.0 when held, else the seconds until one may free."""
        return float((await self._run(["slot", holder, str(max_concurrent), repr(lease_seconds)]))[0])

    async def renew(self, holder: str, lease_seconds: float) -> float:
        """Extend ``holder``'s lease: 1.0, or 0.0 when it had expired."""
        return float((await self._run(["renew", holder, repr(lease_seconds)]))[0])

    async def release(self, holder: str) -> float:
        """Free ``holder``'s slot: 1.0, or 0.0 when it held none."""
        return float((await self._run(["release", holder]))[0])

    async def _run(self, args: list[str]) -> Any:
        """One call of the limiter's script, marked as a script call so the retry policy never
        re-sends one that may have run (a bucket charged twice)."""
        with script_call():
            return await self._script(keys=[self.key], args=args)

    async def close(self) -> None:
        """Close the Redis client when it is this state's own."""
        if self.owns_redis:
            await self.redis.aclose()
            self.owns_redis = False
