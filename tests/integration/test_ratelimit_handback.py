"""Tokens a judge call hands back (its estimate beyond its real use, or all of it when cancelled) are
used at once by the fleet's waiters, on the real Redis at 127.0.0.1:6379 and across real processes.

The measure is the share of ``max_tpm`` the fleet gets, against a baseline taken in the same run:
the limiter as it was before, whose waiters slept out the refill the bucket named and whose bucket
took hand-backs only up to full (the processes patch both back in). Never an absolute latency.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from rewardq.queue.keys import Keyspace
from rewardq.reward.ratelimit import FleetRateLimiter, LocalRateLimiter
from tests.conftest import REDIS_URL
from tests.support.cli_procs import REPO
from tests.support.helpers import seconds_to_use_a_hand_back
from tests.support.together import start_together

TPM, ESTIMATE, USE = 60_000, 1_000, 200  # the case: ~20 % of the limit before
RATE = TPM / 60  # tokens per second; also the bucket's capacity (one second of the rate)
CALL_SECONDS = 1.0  # how long one judge call takes (judges answer in seconds)
PROCS, CALLERS = 2, 6  # callers per process
# Seconds of the run, and where the steady window starts: from a full bucket the calls a second
# grow as 1, 1.8, 2.4, ... towards 5 (each second's refill, plus 0.8 of the last second's calls
# handed back), so the first seconds say little about the rate the fleet holds.
DURATION, STEADY = 16.0, 6.0

# One "worker": CALLERS concurrent judge calls in a loop, each as the judge client makes it: reserve
# the estimate, call, settle to the real use. `before` is the limiter as it was: waiters sleep out the
# wait the bucket names (no doorbell, no re-poll) and a hand-back fills the bucket no further than
# full; `now` is the limiter as it is (`woken`, the waiting of now with the old hand-back, is
# what docs/judges.md quotes beside them).
_JUDGE_CALLS = """
import asyncio, json, sys, time
import redis.asyncio as aioredis
from rewardq.reward.ratelimit import FleetRateLimiter
from rewardq.reward.ratelimit.doorbell import Doorbell
async def main():
    url, key, mode, duration = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    tpm, estimate, use, call_s, callers = (float(a) for a in sys.argv[5:10])
    if mode == "before":
        Doorbell.ring = lambda self: None
    r = aioredis.Redis.from_url(url)
    lim = FleetRateLimiter(r, key, max_tpm=tpm, max_concurrent=None, repoll=1e9 if mode == "before" else 0.05)
    if mode in ("before", "woken"):
        take = lim._take
        lim._take = lambda *a, hand_back=False, **kw: take(*a, **kw)
    await r.ping()
    print("READY", flush=True)
    start_at = float(await asyncio.to_thread(sys.stdin.readline))
    stamps = []
    async def caller():
        while True:
            await lim.acquire_tokens(estimate)
            now = time.time()
            if now >= start_at + duration:
                await lim.charge_tokens(-estimate)
                return
            stamps.append(now - start_at)
            await asyncio.sleep(call_s)
            await lim.charge_tokens(use - estimate)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    await asyncio.gather(*(caller() for _ in range(int(callers))))
    print(json.dumps({"stamps": stamps, "stats": lim.stats()}), flush=True)
    await r.aclose()
asyncio.run(main())
"""


async def _fleet(mode: str) -> list[float]:
    """Run PROCS processes of CALLERS callers each on a fresh limiter; the start times of their calls."""
    key = Keyspace(f"rqtest-{uuid.uuid4().hex[:12]}").ratelimit("judge")
    argv = [REDIS_URL, key, mode, str(DURATION), str(TPM), str(ESTIMATE), str(USE), str(CALL_SECONDS), str(CALLERS)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _JUDGE_CALLS, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(PROCS)
    ]
    try:
        await asyncio.to_thread(start_together, procs)  # every process imported and connected
        outs = [await asyncio.to_thread(p.communicate, timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        r = aioredis.Redis.from_url(REDIS_URL)
        await r.delete(key)
        await r.aclose()
    assert all(p.returncode == 0 for p in procs)
    runs = [json.loads(out[0]) for out in outs]
    if mode == "now":  # (as it was, one process's waiters could sleep through the whole run)
        assert all(len(run["stamps"]) > 0 for run in runs), "every process made calls"
    return sorted(t for run in runs for t in run["stamps"])


async def test_tokens_handed_back_are_used_by_the_fleet_and_the_limit_holds() -> None:
    # Given two processes of six judge callers each, an estimate five times the real use, max_tpm 60,000
    # When they call for 16 s with the limiter as it was, and as it is
    runs = {mode: await _fleet(mode) for mode in ("before", "now")}
    window = DURATION - STEADY

    def share(ts: list[float]) -> float:
        """Tokens per minute used in the steady window, as a share of max_tpm."""
        return sum(USE for t in ts if t >= STEADY) / window * 60 / TPM

    print(
        "steady share of max_tpm (calls/min; the limit allows "
        f"{TPM / USE:.0f} of this size): "
        + ", ".join(f"{m} {share(ts):.0%} ({sum(t >= STEADY for t in ts) / window * 60:.0f})" for m, ts in runs.items())
    )
    before, stamps = share(runs["before"]), share(runs["now"])
    # Then the fleet gets most of the limit, well over what the limiter as it was gave it
    assert before < 0.55, before  # the defect: under half
    assert stamps >= 0.7 and stamps >= 1.5 * before, (stamps, before)
    # And never more than the limit: by any moment t, the calls made used at most a full bucket plus
    # the refill (the bucket settles every call to its real use); one call of slack for clock skew
    # between the processes
    # (the hand-backs lift the bucket to at most two seconds of the rate)
    for i, t in enumerate(runs["now"]):
        assert (i + 1) * USE <= 2 * RATE + RATE * t + USE, (i, t)


@pytest.fixture
async def redis() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


@pytest.mark.parametrize("where", ["same process", "another process", "local"])
async def test_a_cancelled_calls_tokens_wake_a_waiter_long_before_the_refill(redis: aioredis.Redis, where: str) -> None:
    key = Keyspace(f"rqtest-{uuid.uuid4().hex[:12]}").ratelimit("judge")
    other = aioredis.Redis.from_url(REDIS_URL)

    def limiter(client: Any) -> FleetRateLimiter | LocalRateLimiter:
        if where == "local":
            return LocalRateLimiter(max_tpm=600, max_concurrent=None)
        return FleetRateLimiter(client, key, max_tpm=600, max_concurrent=None)

    try:
        # Given a bucket of 10 tokens refilled at 10/s, into which one call reserved 50 (oversize:
        # the level is -40), and a waiter for 10 tokens: the refill alone would take 5 s
        giver = limiter(redis)
        waiter = giver if where in ("same process", "local") else limiter(other)
        # When the call is cancelled and hands its 50 tokens back
        took = await seconds_to_use_a_hand_back(giver, waiter)
        # Then the waiter went well before the 5 s the refill would have taken
        assert took < 0.3 * 5.0, took
    finally:
        await other.aclose()
        await redis.delete(key)
