"""The judge answer cache (rewardq.reward.judge.cache) on the real Redis, and its in-process twin:
a hit sends nothing, one of two racing callers sends, a dead holder's claim lapses after its lease,
a failed holder frees the claim at once, answers live for result_ttl, counters add up fleet-wide."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aredis

from rewardq.queue.keys import Keyspace
from rewardq.reward.judge.cache import JudgeCache, LocalJudgeCache, judge_totals
from tests.support.sync_client import SyncClient


class Caches:
    """``caches(**settings)``: caches sharing one store (the same Redis namespace, or one process's memory)."""

    def __init__(self, kind: str, redis_url: str, ns: str) -> None:
        self.kind, self.redis_url, self.ns = kind, redis_url, ns
        self.clients: list[aredis.Redis] = []
        self.local: LocalJudgeCache | None = None

    def __call__(self, **settings: Any) -> JudgeCache | LocalJudgeCache:
        settings.setdefault("ttl", 60.0)
        if self.kind == "local":
            self.local = self.local or LocalJudgeCache(**settings)
            return self.local
        r = aredis.Redis.from_url(self.redis_url)
        self.clients.append(r)
        return JudgeCache(r, Keyspace(self.ns), **settings)


@pytest.fixture(params=["redis", "local"])
async def caches(request: pytest.FixtureRequest, redis_url: str, ns: str) -> AsyncIterator[Caches]:
    made = Caches(request.param, redis_url, ns)
    yield made
    for r in made.clients:
        await r.aclose()


async def test_a_hit_returns_the_answer_and_claims_nothing(caches: Caches) -> None:
    cache = caches()
    async with cache.claim("d1") as first:
        assert not first.hit
        await first.put('{"contents": ["Score: 1"]}')
    async with cache.claim("d1") as again:
        assert again.hit and again.answer == '{"contents": ["Score: 1"]}'
        with pytest.raises(RuntimeError, match="cache hit"):
            await again.put("x")


async def test_of_two_racing_callers_one_sends_and_the_other_gets_its_answer(caches: Caches) -> None:
    a, b = caches(), caches()
    sent: list[str] = []

    async def call(cache: JudgeCache | LocalJudgeCache, who: str) -> Any:
        async with cache.claim("race") as c:
            if c.hit:
                return c.answer
            sent.append(who)
            await asyncio.sleep(0.3)  # the request in flight
            await c.put(f"answer of {who}")
            return f"answer of {who}"

    got = await asyncio.gather(call(a, "a"), call(b, "b"))
    assert len(sent) == 1 and list(got) == [f"answer of {sent[0]}"] * 2


async def test_a_dead_holders_claim_lapses_after_its_lease(caches: Caches) -> None:
    short = caches(lease_seconds=0.6)
    kind, _ = await short._op("orphan", "get", "a-worker-that-is-then-killed")  # claimed, never renewed
    assert kind == "claimed"
    other = caches(lease_seconds=0.6)
    t0 = time.monotonic()
    async with other.claim("orphan") as c:
        waited = time.monotonic() - t0
        assert not c.hit  # the survivor sends the request itself
        await c.put("late answer")
    assert 0.3 < waited < 5.0, waited
    assert c.waited > 0


async def test_a_holder_that_fails_frees_the_claim_at_once(caches: Caches) -> None:
    a, b = caches(lease_seconds=30.0), caches(lease_seconds=30.0)
    started = asyncio.Event()

    async def failing() -> None:
        with pytest.raises(RuntimeError):
            async with a.claim("flaky"):
                started.set()
                await asyncio.sleep(0.2)
                raise RuntimeError("judge down")

    async def waiting() -> float:
        await started.wait()
        t0 = time.monotonic()
        async with b.claim("flaky") as c:
            assert not c.hit
            return time.monotonic() - t0

    _, waited = await asyncio.gather(failing(), waiting())
    assert waited < 5.0  # not the 30 s lease


async def test_a_held_claim_is_renewed_while_its_holder_works(caches: Caches) -> None:
    a, b = caches(lease_seconds=0.6), caches(lease_seconds=0.6)
    async with a.claim("slow") as c:
        assert not c.hit

        async def take() -> None:
            async with b.claim("slow"):
                raise AssertionError("claimed while the holder was alive")

        with pytest.raises(asyncio.TimeoutError):  # the other caller keeps waiting: the lease is renewed
            await asyncio.wait_for(take(), 1.5)
        await c.put("done")
    async with b.claim("slow") as after:
        assert after.hit and after.answer == "done"


async def test_answers_live_for_result_ttl_and_counters_add_up(caches: Caches, sync_redis: SyncClient, ns: str) -> None:
    cache = caches(ttl=120.0)
    async with cache.claim("ttl") as c:
        await c.put("kept")
    await cache.count("judge-a", requests=2, errors=1, answers=1, prompt_tokens=50, completion_tokens=5)
    await caches(ttl=120.0).count("judge-a", requests=1, answers=1, cache_hits=3)
    if caches.kind == "local":
        assert isinstance(cache, LocalJudgeCache)
        assert cache.counters["judge-a"]["requests"] == 3
        return
    ttl = sync_redis.pttl(Keyspace(ns).judge("ttl"))
    assert 110_000 < ttl <= 120_000
    totals = judge_totals(sync_redis, Keyspace(ns))
    assert totals == {
        "judge-a": {
            "requests": 3,
            "errors": 1,
            "failed": 0,
            "answers": 2,
            "cache_hits": 3,
            "prompt_tokens": 50,
            "completion_tokens": 5,
            "aborted": 0,
            "shared_hits": 0,
            "saved_tokens": 0,
            "error_rate": round(1 / 3, 4),
        }
    }


async def test_without_reuse_every_caller_sends(caches: Caches) -> None:
    cache = caches(reuse=False)
    for _ in range(2):
        async with cache.claim("fresh") as c:
            assert not c.hit
            await c.put("not kept")
