"""The asyncio client's safety net for ``done`` entries it never saw: one sweep of the awaited
trajectories' states every ``SWEEP_INTERVAL`` seconds, instead of every waiter reading its own keys
every 2 s (what a burst of thousands of waiting trajectories paid for in producer CPU)."""

from __future__ import annotations

import asyncio

import pytest

from rewardq import AsyncRewardClient
from rewardq.errors import RewardTimeout
from rewardq.producers import aio
from rewardq.queue.keys import Keyspace
from tests.support.cluster import SHARDS, LocalCluster
from tests.support.helpers import SAMPLE, count_reads, output, running_workers
from tests.support.managers import LengthManager


def _lose_every_done_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher sees no ``done`` entry (as if each were lost): only the sweep can ring a waiter."""
    monkeypatch.setattr(aio, "finished", lambda ks, resp, last: [])


async def test_a_trajectory_whose_done_entry_was_lost_is_found_by_the_sweep(
    ns: str, redis_url: str, length_manager: LengthManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lose_every_done_entry(monkeypatch)
    monkeypatch.setattr(aio, "SWEEP_INTERVAL", 0.05)
    monkeypatch.setattr(aio, "FULL_RECHECK", 3600.0)  # no waiter reads on its own before its deadline
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    async with running_workers(ns, redis_url, [length_manager], concurrency=8):
        got = await asyncio.gather(
            *(
                client.put_trajectory_and_wait(f"l{t}", "s", [output(3, 2), output(4, t % 5 + 1)], SAMPLE, timeout=60)
                for t in range(40)
            )
        )
    assert [[r.reward_score for r in res.values()] for _, res in got] == [[float(t % 5 + 1)] * 2 for t in range(40)]
    assert not client._watchers
    await client.aclose()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "rewardq-done-sweeper" and not t.done()]


async def test_waiters_of_unfinished_trajectories_read_nothing_until_their_deadline(
    ns: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody scores this namespace: the sweeps (many, here) find no ended trajectory and wake
    nobody, and each waiter reads its keys once, at its deadline (it read them every 2 s)."""
    monkeypatch.setattr(aio, "SWEEP_INTERVAL", 0.05)
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    reads = count_reads(client, monkeypatch)
    swept: list[int] = []
    real_sweep = client._sweep

    async def counting_sweep() -> None:
        swept.append(len(client._watchers))
        await real_sweep()

    monkeypatch.setattr(client, "_sweep", counting_sweep)
    outcomes = await asyncio.gather(
        *(client.put_trajectory_and_wait(f"w{t}", "s", [output(2, 1)], SAMPLE, timeout=2.5) for t in range(30)),
        return_exceptions=True,
    )
    assert all(isinstance(o, RewardTimeout) for o in outcomes)
    assert len(reads) == 30 and sorted(k for keys in reads for k in keys) == sorted(f"w{t}_s_0" for t in range(30))
    assert len(swept) >= 10 and max(swept) == 30
    await client.aclose()


async def test_a_sweep_asks_about_at_most_its_share_and_every_trajectory_in_turn(
    ns: str, redis_url: str, length_manager: LengthManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lose_every_done_entry(monkeypatch)
    monkeypatch.setattr(aio, "SWEEP_INTERVAL", 0.05)
    monkeypatch.setattr(aio, "SWEEP_MAX", 7)  # 50 waiting trajectories: each sweep asks about 7 of them
    monkeypatch.setattr(aio, "FULL_RECHECK", 3600.0)
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    async with running_workers(ns, redis_url, [length_manager], concurrency=8):
        got = await asyncio.gather(
            *(
                client.put_trajectory_and_wait(f"m{t}", "s", [output(3, t % 4 + 1)], SAMPLE, timeout=60)
                for t in range(50)
            )
        )
    assert [r.reward_score for _, res in got for r in res.values()] == [float(t % 4 + 1) for t in range(50)]
    await client.aclose()


@pytest.mark.cluster
@pytest.mark.usefixtures("single_slot_scripts")
async def test_the_sweep_reads_states_across_a_clusters_shards(
    redis_cluster: LocalCluster, cns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards = SHARDS
    _lose_every_done_entry(monkeypatch)
    monkeypatch.setattr(aio, "SWEEP_INTERVAL", 0.05)
    monkeypatch.setattr(aio, "FULL_RECHECK", 3600.0)
    url = redis_cluster.url
    ks = Keyspace(cns, shards)
    client = AsyncRewardClient.from_url(url, namespace=cns, shards=shards)
    async with running_workers(cns, url, [LengthManager(None)], shards=shards, concurrency=8):
        got = await asyncio.gather(
            *(
                client.put_trajectory_and_wait(f"c{t}", "s", [output(2, t % 3 + 1)], SAMPLE, timeout=60)
                for t in range(36)
            )
        )
    assert {ks.shard_of(f"c{t}_s") for t in range(36)} == set(range(shards))
    assert [r.reward_score for _, res in got for r in res.values()] == [float(t % 3 + 1) for t in range(36)]
    await client.aclose()


async def test_the_blocking_client_finds_ended_trajectories_by_the_sweep_in_turn(
    ns: str, redis_url: str, length_manager: LengthManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RewardClient.wait_rewards`` over more trajectories than one sweep asks about, every ``done``
    entry lost: the sweeps take the trajectories in turn, and every result arrives."""
    from rewardq import RewardClient
    from rewardq.producers import client as blocking

    monkeypatch.setattr(blocking, "finished_tids", lambda ks, resp, last: [])
    monkeypatch.setattr(blocking, "SWEEP_INTERVAL", 0.05)
    monkeypatch.setattr(blocking, "SWEEP_MAX", 5)
    monkeypatch.setattr(blocking, "FULL_RECHECK", 3600.0)
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = [k for t in range(30) for k in client.put_trajectory(f"b{t}", "s", [output(3, t % 6 + 1)], SAMPLE)]
    async with running_workers(ns, redis_url, [length_manager], concurrency=8):
        got = await asyncio.to_thread(client.wait_rewards, keys, 60)
    assert [r.reward_score for r in got.values()] == [float(t % 6 + 1) for t in range(30)]
    client.close()
