"""Quarantine with in-process workers on the real Redis: after an attempt that never finished,
a trajectory is scored alone; a graceful hand-back is not held against it."""

from __future__ import annotations

import asyncio
from typing import Any

from tensordict import TensorDict

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from rewardq.reward.base import RewardManager
from rewardq.reward.rows import last_row, valid_response_ids
from tests.support.helpers import (
    SAMPLE,
    Hang,
    PeakCounter,
    abandon_worker,
    open_test_worker,
    output,
    running_workers,
    stop_while_scoring,
    worker_config,
)
from tests.support.sync_client import SyncClient


class Overlap(RewardManager):
    """Reward = final response length; ``at_once.peak`` is the most trajectories it scored at once."""

    at_once = PeakCounter()

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        with type(self).at_once:
            await asyncio.sleep(0.1)
            return {"reward_score": float(valid_response_ids(last_row(data)).shape[0]), "reward_extra_info": {}}


async def test_trajectories_of_a_dead_worker_are_scored_one_at_a_time_then_new_ones_together(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    # Given four trajectories in flight at a worker that dies
    keys = [client.put_trajectory(f"dead{i}", "0", [output(2, 3 + i)], SAMPLE)[0] for i in range(4)]
    a = await open_test_worker(worker_config(ns, redis_url, name="A"), manager=Hang(None))
    await a.handle(await a.broker.read([0], 10, None))
    assert len(a.in_flight) == 4
    await abandon_worker(a)
    Overlap.at_once = PeakCounter()
    async with running_workers(ns, redis_url, [Overlap(None)]):
        # When another worker takes them over
        res = await asyncio.to_thread(client.wait_rewards, keys, 30)
        # Then each is scored, alone: never two at once
        assert [r.reward_score for r in res.values()] == [3.0, 4.0, 5.0, 6.0]
        assert Overlap.at_once.peak == 1
        for i in range(4):
            assert sync_redis.hmget(ks.traj(0, f"dead{i}_0"), "attempts", "solo") == [b"2", b"1"]
        # And fresh trajectories afterwards score side by side again
        fresh = [client.put_trajectory(f"fresh{i}", "0", [output(2, 2)], SAMPLE)[0] for i in range(6)]
        await asyncio.to_thread(client.wait_rewards, fresh, 30)
        assert Overlap.at_once.peak > 1
    client.close()


async def test_a_trajectory_handed_back_at_shutdown_is_not_quarantined(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    (key,) = client.put_trajectory("handed", "0", [output(2, 5)], SAMPLE)
    # Given a worker stopping (SIGTERM) while it scores a trajectory that outlasts its grace
    await stop_while_scoring(worker_config(ns, redis_url, name="A", shutdown_grace=0.3))
    # Then the attempt its lease counted is taken back when it hands the trajectory back
    assert sync_redis.hget(ks.traj(0, "handed_0"), "attempts") == b"0"
    Overlap.at_once = PeakCounter()
    async with running_workers(ns, redis_url, [Overlap(None)]):
        res = await asyncio.to_thread(client.wait_rewards, [key], 30)
    # And the next worker scores it as a first attempt (no solo start counted)
    assert res[key].status == "ok" and res[key].reward_score == 5.0
    assert sync_redis.hmget(ks.traj(0, "handed_0"), "attempts", "solo") == [b"1", None]
    client.close()
