"""The ``rate_limited`` manager (alias ``limited``): results on timeout / error, acquisition order,
and fleet-wide limits on real Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from tensordict import TensorDict

from rewardq.consumers.batch import build_batch
from rewardq.errors import ConfigError, ScoringError, ScoringTimeout, TransientError
from rewardq.queue.keys import Keyspace
from rewardq.queue.states import FailureKind, failure_kind_of
from rewardq.reward.base import ManagerContext, ScoreFn
from rewardq.reward.managers.limited import LimitedRewardManager
from rewardq.reward.ratelimit import FleetRateLimiter, LocalRateLimiter
from tests.support.checks import must
from tests.support.helpers import PeakCounter
from tests.support.managers import MakeManager, set_up_managers
from tests.support.records import TOK, record
from tests.support.sync_client import SyncClient


def trajectory(
    response: str = "The answer is 42", ground_truth: str = "42", extra_info: dict[str, Any] | None = None
) -> TensorDict:
    sample = {
        "data_source": "judge",
        "reward_model": {"ground_truth": ground_truth},
        "extra_info": dict(extra_info or {"split": "test"}),
    }
    return build_batch(
        [
            record(
                i,
                response if i == 1 else "thinking",
                final=i == 1,
                sample=sample,
                prompt="Question?",
                num_turns=i + 1,
                extra_fields={"judge_hint": f"h{i}"},
                reward_score=0.5,
            )
            for i in range(2)
        ]
    )


@pytest.fixture
async def managers(redis_url: str, ns: str) -> AsyncIterator[MakeManager[LimitedRewardManager]]:
    def build(fn: ScoreFn, *, redis: bool = True, worker: str = "w0", **options: Any) -> LimitedRewardManager:
        ctx = ManagerContext(redis_url=redis_url if redis else None, namespace=ns, worker_name=worker)
        return LimitedRewardManager(TOK, fn, context=ctx, **options)

    async with set_up_managers(build) as make:
        yield make


async def judge(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"score": 1.0 if ground_truth in solution_str else 0.0, "seen": dict(extra_info)}


async def test_scores_with_the_judge_and_merges_extra_fields_only(managers: MakeManager[LimitedRewardManager]) -> None:
    m = await managers(judge)
    data = trajectory(extra_info={"split": "test", "judge_hint": "from-dataset"})
    out = await m.run_single(data)
    assert out["reward_score"] == 1.0
    # only the final output's extra_fields are merged; no num_turns / rollout_reward_scores here
    assert out["reward_extra_info"]["seen"] == {"split": "test", "judge_hint": "h1"}
    assert data[-1]["extra_info"] == {"split": "test", "judge_hint": "from-dataset"}  # a copy was merged
    assert isinstance(m.limiter, FleetRateLimiter)


async def test_a_call_that_times_out_is_a_timeout_failure_never_a_zero(
    managers: MakeManager[LimitedRewardManager],
) -> None:
    async def slow(**kw: Any) -> None:
        await asyncio.sleep(30)

    m = await managers(slow, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(ScoringTimeout, match="timed out after 0.3s") as failed:
        await m.run_single(trajectory())
    # verl scores it 0.0 with this extra info: the error result keeps the extra info, not the zero
    assert failed.value.extra_info == {"timeout": True, "acc": 0.0}
    assert failure_kind_of(failed.value) is FailureKind.TIMEOUT
    assert time.monotonic() - t0 < 5.0


async def test_a_failing_call_is_a_failure_of_its_own_kind_never_a_zero(
    managers: MakeManager[LimitedRewardManager],
) -> None:
    def broken(**kw: Any) -> None:
        raise RuntimeError("judge said no")

    def judge_down(**kw: Any) -> None:
        raise TransientError("judge answered 503", retry_after=4.0)

    def no_score(**kw: Any) -> dict[str, Any]:
        return {"verdict": "yes"}

    m = await managers(broken)
    with pytest.raises(ScoringError, match="RuntimeError: judge said no") as failed:
        await m.run_single(trajectory())
    assert failure_kind_of(failed.value) is FailureKind.SCORER and failed.value.extra_info == {"acc": 0.0}
    m2 = await managers(no_score, limiter_name="other")
    with pytest.raises(ScoringError, match="without 'score'") as failed:
        await m2.run_single(trajectory())
    assert failed.value.extra_info == {"acc": 0.0}
    m3 = await managers(judge_down, limiter_name="third")
    with pytest.raises(ScoringError, match="judge answered 503") as failed:
        await m3.run_single(trajectory())
    assert failure_kind_of(failed.value) is FailureKind.TRANSIENT and failed.value.retry_after == 4.0


class Recording:
    """Wraps the manager's real limiter and logs every step, in order."""

    def __init__(self, inner: Any, log: list[str]) -> None:
        self.inner, self.log = inner, log

    async def acquire_request(self) -> Any:
        self.log.append("request")
        return await self.inner.acquire_request()

    async def acquire_tokens(self, n: int) -> Any:
        self.log.append(f"tokens:{n}")
        return await self.inner.acquire_tokens(n)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        self.log.append("slot")
        async with self.inner.slot():
            yield
        self.log.append("slot released")

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self.inner.stats()
        return result

    async def close(self) -> None:
        await self.inner.close()


async def test_acquisition_order_request_tokens_slot_then_call(
    managers: MakeManager[LimitedRewardManager], sync_redis: SyncClient, ns: str
) -> None:
    log = []
    key = Keyspace(ns).ratelimit("default")

    async def call(**kw: Any) -> float:
        # the call runs while this worker holds a slot in Redis
        held = [f for f in sync_redis.hkeys(key) if f.startswith(b"s:w0:")]
        log.append(f"call with {len(held)} slot(s) held")
        return 0.5

    m = await managers(call, max_rpm=100, max_tpm=10_000, estimated_tokens_per_request=1234, max_concurrent=3)
    m.limiter = Recording(m.limiter, log)
    out = await m.run_single(trajectory())
    assert out == {"reward_score": 0.5, "reward_extra_info": {"acc": 0.5}}
    assert log == ["request", "tokens:1234", "slot", "call with 1 slot(s) held", "slot released"]
    assert [f for f in sync_redis.hkeys(key) if f.startswith(b"s:")] == []
    # both buckets (one second of each rate: 100/60 requests, 10_000/60 tokens) were charged in
    # Redis: 1 request, and the 1234 tokens, oversize for a bucket of 166.7, left it in debt
    assert 0.66 < float(must(sync_redis.hget(key, "b:rpm:tokens"))) < 0.7
    assert -1068 < float(must(sync_redis.hget(key, "b:tpm:tokens"))) < -1066


@pytest.mark.parametrize(
    "limits", [dict(max_rpm=600), dict(max_tpm=60_000, estimated_tokens_per_request=100)], ids=["rpm", "tpm"]
)
async def test_two_managers_share_one_rate_through_redis(
    managers: MakeManager[LimitedRewardManager], limits: dict[str, Any]
) -> None:
    """Two managers (two workers' worth) together get 10 calls/s, not 10 each."""
    calls = []

    async def record(**kw: Any) -> float:
        calls.append(time.monotonic())
        return 1.0

    a = await managers(record, worker="w1", max_concurrent=8, **limits)
    b = await managers(record, worker="w2", max_concurrent=8, **limits)
    # empty the shared bucket first, so the test sees the refill rate rather than the burst
    if "max_rpm" in limits:
        while await a.limiter.try_request() == 0.0:
            pass
    else:
        assert await a.limiter.try_tokens(1000) == 0.0
    t0 = time.monotonic()
    outs = await asyncio.gather(*(m.run_single(trajectory()) for m in [a, b] * 10))
    elapsed = time.monotonic() - t0
    assert [o["reward_score"] for o in outs] == [1.0] * 20
    assert 1.6 < elapsed < 8.0, elapsed  # 20 calls at 10/s; per-worker limits would take ~1 s
    assert a.stats()[("request" if "max_rpm" in limits else "tokens")]["waits"] > 0
    assert b.stats()[("request" if "max_rpm" in limits else "tokens")]["waits"] > 0


async def test_concurrency_limit_holds_across_managers(managers: MakeManager[LimitedRewardManager]) -> None:
    at_once = PeakCounter()

    async def slow(**kw: Any) -> float:
        with at_once:
            await asyncio.sleep(0.1)
        return 1.0

    a = await managers(slow, worker="w1", max_concurrent=2)
    b = await managers(slow, worker="w2", max_concurrent=2)
    outs = await asyncio.wait_for(asyncio.gather(*(m.run_single(trajectory()) for m in [a, b] * 4)), 20)
    assert len(outs) == 8 and at_once.peak == 2


async def test_without_redis_the_limits_hold_in_process(managers: MakeManager[LimitedRewardManager]) -> None:
    at_once = PeakCounter()

    async def slow(**kw: Any) -> float:
        with at_once:
            await asyncio.sleep(0.05)
        return 1.0

    m = await managers(slow, redis=False, max_concurrent=1, max_rpm=6000)
    assert isinstance(m.limiter, LocalRateLimiter)
    outs = await asyncio.gather(*(m.run_single(trajectory()) for _ in range(4)))
    assert [o["reward_score"] for o in outs] == [1.0] * 4 and at_once.peak == 1


@pytest.mark.parametrize(
    "option,value",
    [
        ("max_concurrent", 0),
        ("max_rpm", 0),
        ("max_rpm", -1),
        ("max_tpm", 0),
        ("timeout", 0),
        ("estimated_tokens_per_request", -5),
        ("max_concurrent", 2.5),
    ],
)
def test_non_positive_options_are_refused_naming_the_value(option: str, value: float) -> None:
    with pytest.raises(ConfigError, match=option) as info:
        LimitedRewardManager(TOK, judge, **{option: value})  # type: ignore[arg-type]  # the bad value is the test
    assert repr(value) in str(info.value)
