"""Cancellation through rewardq's verl entry points, on real verl objects and the real Redis: a
cancelled asyncio task awaiting a reward (the adapter's ``_compute_score``, the hook's scoring call)
cancels its trajectory, and a trajectory cancelled by someone else is left out of training without
counting against the run's failure budget."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from rewardq.integrations.verl import RewardqAgentLoopWorker
from rewardq.integrations.verl.scoring import VerlScorer, settings_for
from rewardq.producers.client import RewardClient
from rewardq.queue.keys import Keyspace
from tests.conftest import REDIS_URL, _delete_namespace
from tests.support.sync_client import SyncClient
from tests.verl.data import output, row
from tests.verl.harness import CREATED_NAMESPACES


def adapter(monkeypatch: pytest.MonkeyPatch, namespace: str) -> RewardqAgentLoopWorker:
    monkeypatch.setenv("REWARDQ_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("REWARDQ_NAMESPACE", namespace)
    monkeypatch.setenv("REWARDQ_VERL_ON_ERROR", "zero")
    return object.__new__(RewardqAgentLoopWorker)


@pytest.fixture
def no_fleet() -> Iterator[str]:
    """A namespace no worker serves: whatever is put waits in its stream; deleted after the test."""
    ns = f"t-verl-{uuid.uuid4().hex[:8]}"
    CREATED_NAMESPACES.add(ns)
    yield ns
    _delete_namespace(REDIS_URL, ns)


async def queued_keys(sync_redis: SyncClient, ns: str, n: int) -> list[str]:
    """The keys of the ``n`` records waiting in ``ns``'s stream, once they are there."""
    stream = Keyspace(ns).stream(0)
    for _ in range(500):
        entries = sync_redis.xrange(stream)
        if len(entries) == n:
            return [f[b"key"].decode() for _, f in entries]
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} records never reached {stream}")


async def cancel_midway(sync_redis: SyncClient, ns: str, n: int, awaiting: Callable[[], Awaitable[Any]]) -> list[str]:
    task = asyncio.ensure_future(awaiting())
    keys = await queued_keys(sync_redis, ns, n)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return keys


async def test_cancelling_the_adapters_task_cancels_its_trajectory(
    monkeypatch: pytest.MonkeyPatch, sync_redis: SyncClient, no_fleet: str
) -> None:
    ns = no_fleet
    w = adapter(monkeypatch, ns)
    outputs = [output("turn 0"), output("#### 42")]
    keys = await cancel_midway(sync_redis, ns, 2, lambda: w._compute_score(outputs, kwargs=row("openai/gsm8k", "42")))
    with RewardClient.from_url(REDIS_URL, namespace=ns) as client:
        results = client.get_rewards(keys)
    assert {r.status if r else None for r in results.values()} == {"cancelled"}, results
    assert outputs[-1].reward_score is None  # nothing was handed to verl


async def test_cancelling_the_hooks_scoring_call_cancels_its_trajectory(
    monkeypatch: pytest.MonkeyPatch, sync_redis: SyncClient, no_fleet: str
) -> None:
    ns = no_fleet
    adapter(monkeypatch, ns)  # the settings, from the environment
    scorer = VerlScorer(settings_for(None), None, None, hook=True)  # what the hook's run_single awaits
    outs = [output("#### 42")]
    sample = row("openai/gsm8k", "42")
    keys = await cancel_midway(sync_redis, ns, 1, lambda: scorer.score_trajectory("u", "s", outs, sample))
    with RewardClient.from_url(REDIS_URL, namespace=ns) as client:
        assert client.get_rewards(keys)[keys[0]].status == "cancelled"  # type: ignore[union-attr]


async def test_a_trajectory_cancelled_elsewhere_is_left_out_and_not_counted_as_a_failure(
    monkeypatch: pytest.MonkeyPatch, sync_redis: SyncClient, no_fleet: str
) -> None:
    ns = no_fleet
    w = adapter(monkeypatch, ns)
    outputs = [output("#### 42")]
    scoring = asyncio.ensure_future(w._compute_score(outputs, kwargs=row("openai/gsm8k", "42")))
    [key] = await queued_keys(sync_redis, ns, 1)
    # When another party (the trainer's own bookkeeping) cancels it while the adapter waits
    with RewardClient.from_url(REDIS_URL, namespace=ns) as client:
        assert client.cancel([key]) == 1
    await asyncio.wait_for(scoring, 30)
    # Then the sample is marked cancelled, not failed, and the run's failure budget counted nothing
    final = outputs[-1]
    assert final.extra_fields["reward_failure_kind"] == "cancelled", final.extra_fields
    assert final.reward_score == 0.0  # verl_on_error=zero (masked with NaN under mask)
    budget = {k.decode(): v for k, v in sync_redis.hgetall(Keyspace(ns).verl_budget("local")).items()}
    assert not {k: v for k, v in budget.items() if k.startswith(("c:", "t:", "o:"))}, budget
