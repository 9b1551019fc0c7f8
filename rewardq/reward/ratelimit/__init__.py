"""Fleet-wide rate limits, in one folder: the policy, the Lua script and the calls that send it.

* :mod:`.limiter`      the policy: token buckets and leased concurrency slots, the waiting, the
  counters (:class:`FleetRateLimiter`, its in-process twin :class:`LocalRateLimiter`);
* :mod:`.bucket`       the token-bucket rule (:func:`bucket_take`), as the Lua script applies it;
* :mod:`.doorbell`     how waiters wake when tokens are handed back;
* :mod:`.state`        the script calls on one limiter's Redis hash (:class:`~.state.LimiterState`);
* ``ratelimit.lua``    the one script that changes that hash.

The limiter sends its commands through the client it is given (typed by
:mod:`rewardq.queue.clients`); the hash's key is :meth:`rewardq.queue.keys.Keyspace.ratelimit`.
"""

from rewardq.reward.ratelimit.bucket import bucket_take
from rewardq.reward.ratelimit.limiter import FleetRateLimiter, LocalRateLimiter, RateLimitWait, open_limiter

__all__ = ["FleetRateLimiter", "LocalRateLimiter", "RateLimitWait", "bucket_take", "open_limiter"]
