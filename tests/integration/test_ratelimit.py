"""The fleet-wide rate limiter, on the real Redis at 127.0.0.1:6379 and with real processes.

Each test uses its own namespace (uuid) and deletes only its own keys.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from rewardq.errors import ConfigError
from rewardq.queue.keys import Keyspace
from rewardq.reward.ratelimit import FleetRateLimiter, LocalRateLimiter, bucket_take
from tests.conftest import REDIS_URL
from tests.support.checks import must
from tests.support.cli_procs import REPO
from tests.support.helpers import PeakCounter
from tests.support.together import start_together


@pytest.fixture
async def redis() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
async def key(redis: aioredis.Redis) -> AsyncIterator[str]:
    ns = f"rqtest-{uuid.uuid4().hex[:12]}"
    k = Keyspace(ns).ratelimit("t")
    yield k
    async for found in redis.scan_iter(match=f"{ns}:*"):
        await redis.delete(found)


MakeLimiter = Callable[..., FleetRateLimiter | LocalRateLimiter]


@pytest.fixture(params=["fleet", "local"])
def make(request: pytest.FixtureRequest, redis: aioredis.Redis, key: str) -> MakeLimiter:
    """Build a limiter of either backend: the contract tests run on both."""

    def factory(**kw: Any) -> FleetRateLimiter | LocalRateLimiter:
        if request.param == "fleet":
            return FleetRateLimiter(redis, key, **kw)
        return LocalRateLimiter(**kw)

    return factory


# ---------------------------------------------------------------------------------------
# the bucket rule itself
# ---------------------------------------------------------------------------------------


def test_bucket_rule_refill_wait_and_debt() -> None:
    # a new bucket is full, and holds one second of the rate (verl's): 120 rpm is 2 requests
    assert bucket_take(None, None, 10.0, capacity=120, cost=1) == (0.0, 1.0)
    # refill is continuous at rate/60 per second, capped at one second's worth
    assert bucket_take(0.0, 10.0, 11.0, capacity=120, cost=2) == (0.0, 0.0)
    assert bucket_take(0.0, 10.0, 1000.0, capacity=120, cost=0, look=True) == (0.0, 2.0)
    # not enough: the wait is exactly what the refill needs, and nothing is taken
    wait, level = bucket_take(0.25, 10.0, 10.0, capacity=60, cost=1)
    assert (wait, level) == (0.75, 0.25)
    # oversize (5 tokens, bucket of 1) on a partly full bucket waits until the bucket is full ...
    wait, level = bucket_take(0.5, 10.0, 10.0, capacity=60, cost=5)
    assert (wait, level) == (0.5, 0.5)
    # ... then goes, leaving debt that the next request must wait out
    wait, level = bucket_take(0.5, 10.0, 10.5, capacity=60, cost=5)
    assert (wait, level) == (0.0, -4.0)
    assert bucket_take(-4.0, 10.5, 10.5, capacity=60, cost=1) == (5.0, -4.0)
    # a clock that steps back refills nothing (and does not drain either)
    assert bucket_take(0.75, 100.0, 90.0, capacity=60, cost=0.5) == (0.0, 0.25)


@pytest.mark.parametrize(
    "bad",
    [
        {"max_rpm": 0},
        {"max_rpm": -5},
        {"max_tpm": 0},
        {"max_concurrent": 0},
        {"max_concurrent": 1.5},
        {"lease_seconds": 0},
    ],
)
def test_bad_limits_are_refused_naming_the_value(bad: dict[str, float] | dict[str, int]) -> None:
    name, value = next(iter(bad.items()))
    with pytest.raises(ConfigError, match=name) as info:
        LocalRateLimiter(**bad)
    assert repr(value) in str(info.value)


# ---------------------------------------------------------------------------------------
# contract tests, on both backends
# ---------------------------------------------------------------------------------------


async def test_burst_then_wait_for_refill(make: MakeLimiter) -> None:
    lim = make(max_rpm=600, max_concurrent=None)  # a bucket of 10 (one second), refilled at 10/s
    t0 = asked = time.monotonic()
    taken = 0
    while (wait := await lim.try_request()) == 0.0:
        taken += 1
        asked = time.monotonic()
    # the full bucket at once, plus one per 0.1 s the calls took (on a loaded machine, tens of ms each)
    assert 10 <= taken <= 10 + 10 * (asked - t0)
    assert 0 < wait <= 0.1  # the next token: less than 0.1 s away
    # what was left at the refusal (1 - 10 * wait) plus at most the refill since it was asked
    assert 0 <= must(await lim.level("rpm")) <= 1 - 10 * wait + 10 * (time.monotonic() - asked) + 1e-6
    assert await lim.level("tpm") is None  # that limit is off


async def test_a_minute_of_budget_never_goes_out_at_once(make: MakeLimiter) -> None:
    # verl's semantics: 120 rpm is a smooth 2/s with a burst of 2, not 120 requests at once
    lim = make(max_rpm=120, max_concurrent=None)
    t0 = time.monotonic()
    taken = 0
    while await lim.try_request() == 0.0:
        taken += 1
    assert 2 <= taken <= 2 + 2 * (time.monotonic() - t0)  # the burst, and the refill while the calls took


async def test_oversize_request_goes_on_a_full_bucket_and_leaves_debt(make: MakeLimiter) -> None:
    lim = make(max_tpm=600, max_concurrent=None)  # bucket of 10 tokens, 10 tokens per second
    # (each bound below allows what the bucket refilled, 10 per second, since t0: on a loaded machine
    # the calls are tens of ms apart)
    t0 = time.monotonic()
    assert await lim.try_tokens(5) == 0.0
    wait = await lim.try_tokens(25)  # oversize: waits until the bucket is full
    assert 0.5 - (time.monotonic() - t0) <= wait <= 0.5
    assert 5 <= must(await lim.level("tpm")) <= 5 + 10 * (time.monotonic() - t0) + 1e-6  # and took nothing meanwhile
    lim2 = make(max_tpm=600, max_concurrent=None)
    # pretend the 0.5 s passed: on a full bucket the oversize request goes at once
    if isinstance(lim, LocalRateLimiter):
        lim._buckets["tpm"] = (10.0, time.monotonic())
    else:
        await lim.redis.hset(lim.key, mapping={"b:tpm:tokens": "10"})  # type: ignore[misc]  # an asyncio client
    t0 = time.monotonic()
    assert await lim.try_tokens(25) == 0.0
    level = must(await lim.level("tpm"))
    assert -15 - 1e-6 <= level <= -15 + 10 * (time.monotonic() - t0)  # debt: 10 - 25
    wait = await lim.try_tokens(1)
    assert 1.6 - (time.monotonic() - t0) <= wait <= 1.6 + 1e-6  # the debt is repaid first
    if isinstance(lim, FleetRateLimiter):  # another client sees the same debt
        assert -15 - 1e-6 <= must(await lim2.level("tpm")) <= -15 + 10 * (time.monotonic() - t0)


async def test_no_charge_puts_the_bucket_deeper_than_a_minute_of_its_rate(make: MakeLimiter) -> None:
    # max_tpm 600,000: a bucket of 10,000 tokens; its deepest debt is a minute of the rate, -600,000
    lim = make(max_tpm=600_000, max_concurrent=None)
    after = await lim.charge_tokens(10**15)  # a judge's usage of 10**15 tokens
    assert after == -600_000.0
    assert await lim.charge_tokens(10**15) == -600_000.0  # and again: no deeper
    wait = await lim.try_tokens(1)
    assert 59.0 < wait <= 60.1  # the fleet waits a minute at most (less what refilled since), not 1e11 s
    if isinstance(lim, FleetRateLimiter):
        assert 0 < await lim.redis.pttl(lim.key) <= 121_100  # refill (61 s) + 60 s, not 1e11 s
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite number"):
            await lim.charge_tokens(bad)
        with pytest.raises(ValueError, match="finite number"):
            await lim.try_tokens(bad)


async def test_a_key_poisoned_before_the_bound_is_read_within_it_and_its_ttl_cut(
    redis: aioredis.Redis, key: str
) -> None:
    # Given a limiter hash as an unbounded version left it: a debt of 1e15 and a TTL of 1e11 s
    await redis.hset(key, mapping={"b:tpm:tokens": "-1e15", "b:tpm:ts": str(time.time()), "b:rpm:tokens": "nan"})  # type: ignore[misc]  # an asyncio client
    await redis.expire(key, 10**11)
    lim = FleetRateLimiter(redis, key, max_tpm=600_000, max_rpm=60, max_concurrent=None)
    # Then it reads as the deepest bounded debt, a NaN level as a full bucket, and the next write cuts the TTL
    assert 59.0 < await lim.try_tokens(1) <= 60.1
    assert await lim.try_request() == 0.0
    await lim.charge_tokens(1)
    assert 0 < await redis.pttl(key) <= 121_100


async def test_a_reservation_is_settled_up_or_down_and_never_past_two_seconds_of_the_rate(
    make: MakeLimiter,
) -> None:
    lim = make(max_tpm=6000, max_rpm=120, max_concurrent=None)  # bucket of 100 tokens, 100 tokens per second
    t0 = time.monotonic()

    def refilled(level: float, expected: float) -> bool:
        """``level`` is ``expected`` plus at most what the refill (100/s) added since t0: on a loaded
        machine the calls are tens of ms apart, a few tokens each time."""
        return expected - 1e-6 <= level <= expected + 100 * (time.monotonic() - t0) + 1e-6

    assert await lim.acquire_tokens(80) == 0.0  # reserved before the call
    assert refilled(await lim.charge_tokens(30), -10)  # it cost 110: 30 more
    assert refilled(await lim.charge_tokens(-60), 50)  # another reserved 60 too many
    # tokens handed back are credited whole, past a full bucket, up to two seconds of the rate
    assert refilled(await lim.charge_tokens(-90), 140)
    assert await lim.charge_tokens(-10_000) == pytest.approx(200)
    # where the refill never takes it: a second later it holds the same, and a take spends from it
    await asyncio.sleep(1.0)
    assert await lim.level("tpm") == pytest.approx(200)
    t0 = time.monotonic()
    assert await lim.try_tokens(150) == 0.0
    assert refilled(must(await lim.level("tpm")), 50)
    # a request token given back (a call never made) fills its bucket, never more
    await lim.give_back_request()
    assert await lim.level("rpm") == pytest.approx(2.0)


async def test_acquire_sleeps_until_allowed_and_counts_waits(make: MakeLimiter) -> None:
    lim = make(max_tpm=6000, max_concurrent=None)  # bucket of 100 tokens, 100 tokens per second
    t0 = time.monotonic()
    assert await lim.acquire_tokens(200) == 0.0  # full bucket: oversize goes, level -100
    t1 = time.monotonic()
    waited = await lim.acquire_tokens(50)  # must wait (100 + 50) / 100 = 1.5 s after the first take
    t2 = time.monotonic()
    assert 1.4 < t2 - t0 < 5.0
    stats = lim.stats()
    assert stats["tokens"]["waits"] == 1 and stats["tokens"]["wait_seconds"] == waited
    # the wait counted is the second call's, which began when the first had returned (on a loaded
    # machine, a good while after the first take)
    assert 1.4 - (t1 - t0) < waited <= t2 - t1
    assert stats["request"]["waits"] == 0 and stats["slot"]["waits"] == 0


async def test_a_wait_counts_the_questions_asked_while_waiting(
    make: MakeLimiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a limiter whose every question takes 50 ms (a loaded machine, or a distant Redis)
    lim = make(max_tpm=6000, max_concurrent=2, lease_seconds=30)
    take, slot_op = lim._take, lim._slot_op

    async def slow_take(*args: Any, **kwargs: Any) -> tuple[float, float]:
        answer = await take(*args, **kwargs)
        await asyncio.sleep(0.05)
        return answer

    async def slow_slot_op(op: str, holder: str) -> float:
        answer = await slot_op(op, holder)
        await asyncio.sleep(0.05)
        return answer

    monkeypatch.setattr(lim, "_take", slow_take)
    monkeypatch.setattr(lim, "_slot_op", slow_slot_op)
    # When a caller waits 1.5 s for tokens, asking again every 50 ms or so, and another waits for a slot
    assert await lim.acquire_tokens(200) == 0.0
    t0 = time.monotonic()
    waited = await lim.acquire_tokens(50)
    took = time.monotonic() - t0
    async with lim.slot(), lim.slot():
        t0 = time.monotonic()
        third = asyncio.create_task(_hold_a_slot(lim))
        await asyncio.sleep(1.0)
    await third
    slot_took = time.monotonic() - t0
    # Then each counts all the time it was held back, its questions included, not only its sleeps
    assert 0.9 * took < waited <= took
    assert lim.stats()["tokens"]["wait_seconds"] == waited
    assert 0.9 * 1.0 < lim.stats()["slot"]["wait_seconds"] <= slot_took


async def _hold_a_slot(lim: FleetRateLimiter | LocalRateLimiter) -> None:
    async with lim.slot():
        pass


async def test_concurrency_slots_are_shared_and_released(make: MakeLimiter) -> None:
    limiters = [make(max_concurrent=2, lease_seconds=5), make(max_concurrent=2, lease_seconds=5)]
    if isinstance(limiters[0], LocalRateLimiter):
        limiters = [limiters[0], limiters[0]]  # one process: one limiter object
    at_once = PeakCounter()

    async def job(i: int) -> None:
        async with limiters[i % 2].slot() as holder:
            assert holder
            with at_once:
                await asyncio.sleep(0.15)

    await asyncio.wait_for(asyncio.gather(*(job(i) for i in range(6))), timeout=20)
    assert at_once.peak == 2
    assert sum(lim.stats()["slot"]["waits"] for lim in set(limiters)) >= 3
    async with limiters[0].slot(), limiters[1].slot():  # all released: two are free again
        assert await limiters[0]._slot_op("slot", "third") > 0


async def test_slot_released_on_cancellation(make: MakeLimiter) -> None:
    lim = make(max_concurrent=1, lease_seconds=30)
    entered = asyncio.Event()

    async def holder() -> None:
        async with lim.slot():
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(holder())
    await asyncio.wait_for(entered.wait(), 5)
    assert await lim._slot_op("slot", "other") > 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await lim._slot_op("slot", "other") == 0.0  # freed at once, not after 30 s


# ---------------------------------------------------------------------------------------
# real processes
# ---------------------------------------------------------------------------------------

_HOLDER = """
import asyncio, sys
import redis.asyncio as aioredis
from rewardq.reward.ratelimit import FleetRateLimiter
async def main():
    r = aioredis.Redis.from_url(sys.argv[1])
    lim = FleetRateLimiter(r, sys.argv[2], max_concurrent=1, lease_seconds=float(sys.argv[3]))
    async with lim.slot():
        print("HELD", flush=True)
        await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_dead_holder_frees_its_slot_after_the_lease(redis: aioredis.Redis, key: str) -> None:
    lease = 1.0
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, REDIS_URL, key, str(lease)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)
        assert line.strip() == "HELD"
        lim = FleetRateLimiter(redis, key, max_concurrent=1, lease_seconds=lease)
        # the live holder renews its lease: for 2.5 leases nobody else gets the slot
        deadline = time.monotonic() + 2.5 * lease
        while time.monotonic() < deadline:
            assert await lim._slot_op("slot", "probe") > 0
            await asyncio.sleep(0.1)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        killed_at = time.monotonic()
        assert await lim._slot_op("slot", "probe") > 0  # the dead holder's lease still runs
        async with lim.slot():
            freed_after = time.monotonic() - killed_at
        assert freed_after <= lease + 1.5
        assert lim.stats()["slot"]["waits"] == 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()


_HAMMER = """
import asyncio, json, sys, time
import redis.asyncio as aioredis
from rewardq.reward.ratelimit import FleetRateLimiter
async def main():
    url, key, rpm, duration = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    r = aioredis.Redis.from_url(url)
    lim = FleetRateLimiter(r, key, max_rpm=rpm, max_concurrent=None)
    await r.ping()
    print("READY", flush=True)
    start_at = float(await asyncio.to_thread(sys.stdin.readline))
    await asyncio.sleep(max(0.0, start_at - time.time()))
    stamps = []
    while True:
        await lim.acquire_request()
        now = time.time()
        if now >= start_at + duration:
            break
        stamps.append(now - start_at)
    print(json.dumps({"stamps": stamps, "stats": lim.stats()}), flush=True)
    await r.aclose()
asyncio.run(main())
"""


async def test_fleet_of_processes_holds_the_combined_rate(key: str) -> None:
    # 2 requests/s, a bucket of 2: each process needs to ask only about once a second to keep the
    # fleet at the limit, which a starved process on a loaded machine still does (at 10/s, two
    # processes given a few % of a core each made 5.5/s)
    rpm, duration, n_procs = 120, 8.0, 2
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _HAMMER, REDIS_URL, key, str(rpm), str(duration)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(n_procs)
    ]
    try:
        await asyncio.to_thread(start_together, procs)
        outs = [await asyncio.to_thread(p.communicate, timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs)
    results = [json.loads(out[0]) for out in outs]
    counts = [len(r["stamps"]) for r in results]
    total = sum(counts)
    rate = rpm / 60
    # everything: the initial burst (one full bucket: one second's worth) plus the refill over the window
    assert total <= rate + rate * duration + 5, counts
    assert total >= rate + 0.75 * rate * duration, counts
    # steady state, after the burst: the fleet together holds 2/s (per-process limiters: 4/s)
    steady = sum(1 for r in results for t in r["stamps"] if t >= 2.0)
    assert 0.75 * rate * (duration - 2.0) <= steady <= rate * (duration - 2.0) + 5, steady
    assert all(c > 0 for c in counts)
    assert all(r["stats"]["request"]["waits"] > 0 for r in results)
    print(f"fleet: {counts} acquisitions in {duration}s, steady {steady / (duration - 2.0):.2f}/s (limit {rate:.2f}/s)")
