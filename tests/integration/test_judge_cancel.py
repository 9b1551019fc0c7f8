"""Giving up on a judge call and on a trajectory, on the real Redis against the stand-in judge:
a judge call cancelled mid-request is aborted (the server sees the client go), its concurrency slot
and claim are released and its request token is back in the fleet's bucket; the shared cache keeps
its own TTL and size bound; an asyncio task awaiting ``put_trajectory_and_wait`` that is cancelled
cancels its trajectory."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
import redis.asyncio as aredis

from rewardq.producers.aio import AsyncRewardClient
from rewardq.queue.keys import Keyspace
from rewardq.reward.judge.cache import JudgeCache
from rewardq.reward.judge.client import ChatJudge
from rewardq.reward.judge.shared import SharedSpace, clear_shared, shared_models
from rewardq.reward.judge.stats import JudgeStats
from rewardq.reward.ratelimit import FleetRateLimiter
from tests.support.judge_standin import JudgeStandin
from tests.support.records import text_output
from tests.support.sync_client import SyncClient

SAMPLE = {"data_source": "judged", "reward_model": {"ground_truth": "42"}}


def body(text: str) -> dict[str, Any]:
    return {"model": "judge-model", "messages": [{"role": "user", "content": text}], "temperature": 0.0, "seed": 0}


async def test_a_judge_call_cancelled_mid_request_is_aborted_and_gives_its_budget_back(
    judge: JudgeStandin, redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    # Given a judge taking 4 s and the fleet's limiter at max_rpm 6 (a bucket of 0.1 token, refilling
    # at 0.1 token/s: one request takes it 1 token into debt) and max_concurrent 1
    judge.control(delay=4.0)
    r = aredis.Redis.from_url(redis_url)
    ks = Keyspace(ns)
    limiter = FleetRateLimiter(r, ks.ratelimit("genrm"), max_rpm=6, max_concurrent=1, lease_seconds=30)
    stats = JudgeStats()
    client = ChatJudge(
        base_url=judge.base_url,
        api_key=None,
        model="judge-model",
        limiter=limiter,
        cache=JudgeCache(r, ks, ttl=60),
        stats=stats,
    )
    await client.setup()
    try:
        # When a call is in flight at the judge and its task is cancelled
        call = asyncio.create_task(client.complete(body("grade=1")))
        for _ in range(200):
            if judge.stats()["in_flight"] == 1:
                break
            await asyncio.sleep(0.02)
        taken = float(sync_redis.hget(ks.ratelimit("genrm"), "b:rpm:tokens") or "nan")
        t_taken = float(sync_redis.hget(ks.ratelimit("genrm"), "b:rpm:ts") or "nan")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # Then the judge saw its client go, ...
        for _ in range(100):
            if judge.stats()["abandoned"] == 1:
                break
            await asyncio.sleep(0.02)
        assert judge.stats()["abandoned"] == 1 and judge.stats()["served"] == 0
        # ... the slot and the claim are free, ...
        fields = {k.decode(): v for k, v in sync_redis.hgetall(ks.ratelimit("genrm")).items()}
        assert not [f for f in fields if f.startswith("s:")], fields
        assert all(sync_redis.hget(k, "c") is None for k in sync_redis.keys(f"{ns}:judge:*"))
        # ... and the request token is back: the level is what it was before the take, refilled since
        level = float(fields["b:rpm:tokens"])
        since = float(fields["b:rpm:ts"]) - t_taken
        assert taken == pytest.approx(0.1 - 1, abs=1e-9)  # a new bucket (0.1) minus the request
        # (a bucket holds at most its size, 0.1: given back and refilled past that, it is full)
        assert level == pytest.approx(min(0.1, taken + 1 + 0.1 * since), abs=1e-6), (taken, level, since)
        assert stats.models["judge-model"]["aborted"] == 1 and stats.models["judge-model"]["requests"] == 0
        # so the next call goes at once, where without the refund it would wait ~9 s for the bucket
        judge.control(delay=0.0)
        t0 = time.monotonic()
        answer = await client.complete(body("grade=0.5"))
        assert "0.5" in answer.contents[0] and time.monotonic() - t0 < 4.0
    finally:
        await client.close()
        await r.aclose()


async def test_the_shared_cache_keeps_its_own_ttl_and_size_bound(
    redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    # Given a shared cache for one model holding at most 3 answers for 120 s
    model = f"judge-{uuid.uuid4().hex[:8]}"
    r = aredis.Redis.from_url(redis_url)
    space = SharedSpace(model, "v1", ttl=120.0, max_entries=3)
    cache = JudgeCache(r, Keyspace(ns), ttl=5.0, shared=space)
    try:
        # When five answers are stored, d0 used again before the fourth arrives
        for i in range(5):
            async with cache.claim(f"d{i}") as c:
                await c.put(f'{{"contents": ["Score: {i}"]}}')
            if i == 2:
                async with cache.claim("d0") as hit:
                    assert hit.hit
        # Then three remain: the most recently used (d0, d3, d4), each with the shared TTL, not result_ttl
        kept = {i for i in range(5) if sync_redis.exists(space.key(f"d{i}"))}
        assert kept == {0, 3, 4}, kept
        assert all(110_000 < sync_redis.pttl(space.key(f"d{i}")) <= 120_000 for i in kept)
        assert shared_models(sync_redis, model) == [{"model": model, "tag": space.tag, "entries": 3}]
        # And the same request read another way (another verdict digest) is another key: a miss
        other = JudgeCache(r, Keyspace(ns), ttl=5.0, shared=SharedSpace(model, "v2", 120.0, 3))
        async with other.claim("d0") as c:
            assert not c.hit
        assert clear_shared(sync_redis, model) == {model: 3}
        assert not any(sync_redis.exists(space.key(f"d{i}")) for i in range(5))
    finally:
        clear_shared(sync_redis, model)
        await r.aclose()


async def test_cancelling_the_task_that_awaits_a_reward_cancels_its_trajectory(
    redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    # Given a trajectory put and awaited with no worker to score it
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    try:
        waiting = asyncio.create_task(
            client.put_trajectory_and_wait("u", "s", [text_output("a"), text_output("b")], SAMPLE, timeout=60)
        )
        ks = await client.keyspace()
        for _ in range(200):
            if sync_redis.xlen(ks.stream(0)) == 2:
                break
            await asyncio.sleep(0.01)
        # When the task awaiting it is cancelled (as an agent loop's is when a rollout stops early)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # Then both its keys read `cancelled`, and the trajectory's end is published
        results = await client.get_rewards(["u_s_0", "u_s_1"])
        assert {r.status if r else None for r in results.values()} == {"cancelled"}, results
        assert all(r is not None and r.cancelled and not r.ok for r in results.values())
        done = sync_redis.xrange(ks.done(0))
        assert [(f[b"tid"], f[b"status"]) for _, f in done] == [(b"u_s", b"cancelled")]
        # and cancelling again, or a finished trajectory, changes nothing
        assert await client.cancel(["u_s_0"]) == 0
    finally:
        await client.aclose()
