"""The token-bucket rule of the fleet's rate limits, in Python (``ratelimit.lua`` applies the very
same rule in Redis; :class:`~rewardq.reward.ratelimit.limiter.LocalRateLimiter` applies this one).
"""

from __future__ import annotations

#: Deepest debt of a rate-limit token bucket, in seconds of its rate: whatever one request is
#: charged (an oversize request, a judge reporting absurd usage), the fleet waits at most this
#: long for the bucket to refill, and its Redis key lives at most this long plus a minute.
RATE_LIMIT_MAX_DEBT_SECONDS = 60.0
#: Highest level of a token bucket, in seconds of its rate, that tokens handed back can lift it to
#: (the refill stops at one second, verl's capacity). A call reserving as much as the bucket holds
#: could otherwise only go on a full bucket, and the tokens it hands back, clipped there, would be
#: lost: with an estimate five times the real use the fleet got about 40 % of ``max_tpm`` however
#: promptly its waiters woke (judge calls of 1 s), and 92 % credited whole. Averaged over any stretch
#: of time the fleet still uses no more than the rate, plus at most this many seconds of it at once.
HAND_BACK_SECONDS = 2.0

#: Slack in bucket comparisons, so that float rounding never asks for a 1e-12 s wait.
_EPS = 1e-9


def bucket_take(
    level: float | None,
    ts: float | None,
    now: float,
    capacity: float,
    cost: float,
    look: bool = False,
    charge: bool = False,
    max_debt_seconds: float = RATE_LIMIT_MAX_DEBT_SECONDS,
    hand_back: bool = False,
) -> tuple[float, float]:
    """The token-bucket rule, in Python; the Lua script applies the very same rule.

    Args:
        level, ts: the stored level and the time it was computed at (None: a new, full bucket).
        now: the current time in seconds.
        capacity: the per-minute limit; the bucket holds one second of it (``capacity / 60``)
            and refills at ``capacity / 60`` per second.
        cost: what this request takes.
        look: only report, take nothing.
        charge: take the cost whatever the level (a cost known only after the call: a judge's
            reported token usage); the level may go negative. A negative cost gives tokens back
            (a request token of a call never made), never past a full bucket.
        max_debt_seconds: the level never goes below ``-max_debt_seconds`` of the rate.
        hand_back: with ``charge`` and a negative cost: tokens a call reserved and did not use,
            credited whole, up to two seconds of the rate (the level may pass the capacity by
            them; the refill never does). Clipped at a full bucket, most of them would be lost
            whenever a reservation is as large as the bucket (see :data:`HAND_BACK_SECONDS`).

    Returns:
        ``(wait, level_after)``: ``wait == 0`` means the cost was taken (``level_after`` may be
        negative after an oversize request); otherwise ``wait`` seconds are needed first.

    >>> bucket_take(None, None, 100.0, capacity=120, cost=1)       # new bucket: full (2 requests)
    (0.0, 1.0)
    >>> bucket_take(0.0, 100.0, 100.25, capacity=120, cost=1)      # 0.25 s refilled 0.5
    (0.25, 0.5)
    >>> bucket_take(2.0, 100.0, 100.0, capacity=120, cost=5)       # oversize on a full bucket
    (0.0, -3.0)
    >>> bucket_take(0.5, 100.0, 100.0, capacity=120, cost=3, charge=True)  # charged afterwards
    (0.0, -2.5)
    >>> bucket_take(2.0, 100.0, 100.0, capacity=120, cost=1e15, charge=True)  # debt: a minute at most
    (0.0, -120.0)
    >>> bucket_take(1.5, 100.0, 100.0, capacity=120, cost=-1.5, charge=True)  # given back: full, no more
    (0.0, 2.0)
    >>> bucket_take(1.5, 100.0, 100.0, capacity=120, cost=-1.5, charge=True, hand_back=True)  # credited whole
    (0.0, 3.0)
    """
    size = rate = capacity / 60.0
    floor = -max_debt_seconds * rate
    if level is None or ts is None:
        level, ts = size, now
    level = min(HAND_BACK_SECONDS * size, max(floor, level))
    if level < size:  # the refill fills the bucket; only a hand-back takes it past full
        level = min(size, level + max(0.0, now - ts) * rate)
    need = min(cost, size)
    if not (charge or level + _EPS * size >= need):
        return (need - level) / rate, level
    if look:
        return 0.0, level
    if cost >= 0:
        return 0.0, max(floor, level - cost)
    ceiling = HAND_BACK_SECONDS * size if hand_back else size
    return 0.0, max(level, min(ceiling, level - cost))
