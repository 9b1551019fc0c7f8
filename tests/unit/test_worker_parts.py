"""The worker's collaborators that need no Redis: the fast-path split, admission, the quarantine turn."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rewardq.consumers.inflight import InFlightTable
from rewardq.consumers.intake import split_whole
from rewardq.consumers.quarantine import Quarantine
from rewardq.consumers.reader import read_groups
from rewardq.queue.codec import OutputRecord
from rewardq.queue.entries import Entry

IDS = np.zeros(1, dtype=np.int32)


def filed(
    uid: str, index: int, final: bool, *, shard: int = 0, deliveries: int = 1
) -> tuple[Entry, OutputRecord, bytes]:
    rec = OutputRecord(uid, "s", index, final, IDS, IDS)
    return Entry(shard, f"1-{uid}{index}", {b"data": b"x"}, deliveries=deliveries), rec, b"x"


def test_only_trajectories_read_whole_and_delivered_once_take_the_fast_path() -> None:
    # Given a batch: a whole trajectory out of order, a partial one, a redelivered whole one,
    # and one with a final output before its last
    batch = [
        filed("whole", 1, True),
        filed("whole", 0, False),
        filed("partial", 1, True),
        filed("again", 0, False),
        filed("again", 1, True, deliveries=2),
        filed("twofinal", 0, True),
        filed("twofinal", 1, True),
    ]
    whole, rest = split_whole(batch)
    # Then only the first is claimed whole, its entries in index order; the others are stored
    assert [(shard, tid, [it[1].index for it in items]) for shard, tid, items in whole] == [(0, "whole_s", [0, 1])]
    assert sorted((it[1].uid, it[1].index) for it in rest) == [
        ("again", 0),
        ("again", 1),
        ("partial", 1),
        ("twofinal", 0),
        ("twofinal", 1),
    ]


def test_same_trajectory_id_on_two_shards_is_two_trajectories() -> None:
    whole, rest = split_whole([filed("u", 0, True, shard=0), filed("u", 0, True, shard=1)])
    assert sorted(shard for shard, _, _ in whole) == [0, 1] and rest == []


def test_read_groups_one_call_on_one_redis_one_per_shard_on_a_cluster() -> None:
    assert read_groups(3, cluster=False) == [[0, 1, 2]]
    assert read_groups(3, cluster=True) == [[0], [1], [2]]


async def test_capacity_closes_at_concurrency_and_a_handed_back_trajectory_stays_held() -> None:
    table = InFlightTable(2)
    assert table.hold(0, "a") is not None and table.capacity.is_set()
    assert table.hold(0, "a") is None  # a redelivery of what we hold is not held twice
    assert table.hold(1, "b") is not None and not table.capacity.is_set()
    assert table.held() == {0: ["a"], 1: ["b"]}
    table.finished("a")
    assert table.capacity.is_set() and list(table.by_tid) == ["b"]
    table.finished("b", handed_back=True)
    assert list(table.by_tid) == ["b"], "a handed-back trajectory must stay held until it is released"


class SoloCounts:
    """The broker's ``start_solo``, counted in memory."""

    def __init__(self) -> None:
        self.solo: dict[str, int] = {}

    async def start_solo(self, shard: int, tid: str, by: int = 1) -> int:
        self.solo[tid] = self.solo.get(tid, 0) + by
        return self.solo[tid]


async def test_a_first_attempt_shares_the_gate_and_a_later_one_scores_alone() -> None:
    broker = SoloCounts()
    q = Quarantine(broker)  # type: ignore[arg-type]  # a recorder stands in for the broker
    async with q.turn(0, "t", attempts=1, earlier=0) as crashes:
        assert crashes == 0 and q.gate.running == 1 and broker.solo == {}
    assert q.gate.running == 0
    broker.solo["t"] = 2  # two earlier solo starts never finished
    async with q.turn(0, "t", attempts=3, earlier=2) as crashes:
        assert crashes == 2 and q.gate.alone
    assert not q.gate.alone and broker.solo["t"] == 3


async def test_a_turn_alone_cancelled_at_shutdown_takes_its_start_back() -> None:
    broker = SoloCounts()
    q = Quarantine(broker)  # type: ignore[arg-type]  # a recorder stands in for the broker
    entered = asyncio.Event()

    async def scoring() -> None:
        async with q.turn(0, "t", attempts=2, earlier=0):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(scoring())
    await asyncio.wait_for(entered.wait(), 1)
    assert broker.solo["t"] == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert broker.solo["t"] == 0 and not q.gate.alone
