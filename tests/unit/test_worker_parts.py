"""The worker's collaborators that need no Redis: the fast-path split, admission, the quarantine turn."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from rewardq.consumers.inflight import InFlightTable
from rewardq.consumers.intake import split_whole
from rewardq.consumers.quarantine import Quarantine
from rewardq.consumers.reader import StreamReader, read_groups
from rewardq.queue.codec import OutputRecord
from rewardq.queue.entries import Entry
from rewardq.queue.reclaim import first_trajectories

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
    table = InFlightTable(2, read_ahead=0)
    assert table.hold(0, "a") is not None and table.capacity.is_set()
    assert table.hold(0, "a") is None  # a redelivery of what we hold is not held twice
    assert table.hold(1, "b") is not None and not table.capacity.is_set()
    assert table.held() == {0: ["a"], 1: ["b"]}
    table.finished("a")
    assert table.capacity.is_set() and list(table.by_tid) == ["b"]
    table.finished("b", handed_back=True)
    assert list(table.by_tid) == ["b"], "a handed-back trajectory must stay held until it is released"


class StartCounts:
    """The attempt notes' ``start_solo``, ``start_cohort`` and ``start_shared``, counted in memory."""

    def __init__(self) -> None:
        self.solo: dict[str, int] = {}
        self.shared: dict[str, int] = {}
        self.cohort: dict[str, int] = {}
        self.width: dict[str, int] = {}

    async def start_cohort(self, shard: int, tid: str, width: int = 0, by: int = 1, *, attempt: int = 0) -> int:
        self.cohort[tid] = self.cohort.get(tid, 0) + by
        if width:
            self.width[tid] = width
        return self.cohort[tid]

    async def cohort_state(self, shard: int, tid: str) -> tuple[int | None, int]:
        return self.width.get(tid), self.cohort.get(tid, 0)

    async def start_solo(self, shard: int, tid: str, by: int = 1, *, attempt: int = 0) -> int:
        self.solo[tid] = self.solo.get(tid, 0) + by
        return self.solo[tid]

    async def start_shared(self, shard: int, tid: str, by: int = 1, *, attempt: int = 0) -> int:
        self.shared[tid] = self.shared.get(tid, 0) + by
        return self.shared[tid]


async def test_a_first_attempt_shares_the_gate_uncounted() -> None:
    broker = StartCounts()
    q = Quarantine(broker)  # type: ignore[arg-type]  # a recorder stands in for the attempt notes
    async with q.turn(0, "t", attempts=1) as turn:
        assert turn.crashes == 0 and turn.counted is None and q.gate.running == 1
        assert broker.solo == {} and broker.shared == {}
    assert q.gate.running == 0


async def test_a_reclaimed_attempt_shares_the_gate_and_counts_its_start_in_the_scorer() -> None:
    # Given a trajectory whose earlier attempt never finished, never seen in a scorer of a reclaimed attempt
    broker = StartCounts()
    q = Quarantine(broker)  # type: ignore[arg-type]  # a recorder stands in for the attempt notes
    async with q.turn(0, "a", attempts=2) as a, q.turn(0, "b", attempts=4) as b:
        # Then it scores beside others (two at once here), each start counted as `shared`
        assert q.gate.running == 2 and not q.gate.cohort
        assert (a.counted, b.counted, a.crashes) == ("shared", "shared", 0)
        assert broker.shared == {"a": 1, "b": 1} and broker.solo == {}
    # And a start taken back (a retry's rest, a refused commit) is taken back once
    await q.take_back(0, "a", a)
    await q.take_back(0, "a", a)
    assert broker.shared == {"a": 0, "b": 1}


async def test_a_trajectory_in_a_scorer_when_a_worker_stopped_scores_alone() -> None:
    broker = StartCounts()
    q = Quarantine(broker)  # type: ignore[arg-type]  # a recorder stands in for the attempt notes
    # Given one earlier start beside others that never finished
    async with q.turn(0, "t", attempts=3, shared=1) as turn:
        assert turn.crashes == 0 and q.gate.cohort and turn.counted == "solo"
    assert not q.gate.cohort and broker.solo["t"] == 1 and "t" not in broker.shared
    # And after two solo starts that never finished, it says it took its worker down twice
    broker.solo["t"] = 2
    async with q.turn(0, "t", attempts=5, solo=2, shared=1) as turn:
        assert turn.crashes == 2 and q.gate.cohort
    assert not q.gate.cohort and broker.solo["t"] == 3


async def test_suspects_score_in_cohorts_halved_after_each_death_until_alone() -> None:
    broker = StartCounts()
    q = Quarantine(broker)  # type: ignore[arg-type]  # a recorder stands in for the attempt notes
    peak = 0

    async def score(tid: str, solo: int = 0) -> int:
        nonlocal peak
        async with q.turn(0, tid, attempts=3, solo=solo, shared=1) as turn:
            peak = max(peak, q.gate.cohort)
            await asyncio.sleep(0.01)
            return turn.crashes

    # Given eight suspects of a worker that died with them in its scorer (never in a cohort)
    tids = [f"t{i}" for i in range(8)]
    await asyncio.wait_for(asyncio.gather(*(score(t) for t in tids)), 5)
    # Then they score as one cohort of eight, each start counted with its width
    assert peak == 8 and broker.width == dict.fromkeys(tids, 8) and broker.cohort == dict.fromkeys(tids, 1)
    # When that cohort's worker died too: they score in two cohorts of four
    peak = 0
    await asyncio.wait_for(asyncio.gather(*(score(t) for t in tids)), 5)
    assert peak == 4 and broker.width == dict.fromkeys(tids, 4) and broker.solo == {}
    # And the half with the killer in it, after one more death, in cohorts of two, then alone
    peak = 0
    await asyncio.wait_for(asyncio.gather(*(score(t) for t in tids[:4])), 5)
    assert peak == 2 and {broker.width[t] for t in tids[:4]} == {2}
    peak = 0
    await asyncio.wait_for(asyncio.gather(*(score(t) for t in tids[:2])), 5)
    assert peak == 1 and broker.solo == {"t0": 1, "t1": 1} and broker.cohort["t0"] == 3
    # And one that died alone stays alone, its death counted against it
    peak = 0
    crashes = await asyncio.wait_for(asyncio.gather(score("t0", solo=1), score("t5")), 5)
    assert peak == 1 and list(crashes) == [1, 0] and broker.solo["t0"] == 2


@pytest.mark.parametrize(("shared", "field"), [(0, "shared"), (1, "solo")])
async def test_a_reclaimed_turn_cancelled_at_shutdown_takes_its_start_back(shared: int, field: str) -> None:
    broker = StartCounts()
    q = Quarantine(broker)  # type: ignore[arg-type]  # a recorder stands in for the attempt notes
    entered = asyncio.Event()

    async def scoring() -> None:
        async with q.turn(0, "t", attempts=2, shared=shared):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(scoring())
    await asyncio.wait_for(entered.wait(), 1)
    counts = getattr(broker, field)
    assert counts["t"] == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert counts["t"] == 0 and not q.gate.cohort and q.gate.running == 0


class CountedThenHung(StartCounts):
    """Counts a start, then never answers: Redis ran the script, and the wait for its reply hangs."""

    def __init__(self) -> None:
        super().__init__()
        self.counted = asyncio.Event()

    async def start_solo(self, shard: int, tid: str, by: int = 1, *, attempt: int = 0) -> int:
        n = await super().start_solo(shard, tid, by, attempt=attempt)
        return n if by < 0 else await self.hang()

    async def start_shared(self, shard: int, tid: str, by: int = 1, *, attempt: int = 0) -> int:
        n = await super().start_shared(shard, tid, by, attempt=attempt)
        return n if by < 0 else await self.hang()

    async def hang(self) -> int:
        self.counted.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


@pytest.mark.parametrize(("shared", "field"), [(0, "shared"), (1, "solo")])
async def test_a_start_counted_while_its_reply_is_awaited_at_shutdown_is_taken_back(shared: int, field: str) -> None:
    # Given a count that Redis ran, whose reply the stopping worker no longer waits for
    broker = CountedThenHung()
    q = Quarantine(broker)  # type: ignore[arg-type]  # a recorder stands in for the attempt notes

    async def scoring() -> None:
        async with q.turn(0, "t", attempts=2, shared=shared):
            raise AssertionError("the turn never starts: its count never answered")

    task = asyncio.create_task(scoring())
    await asyncio.wait_for(broker.counted.wait(), 1)
    assert getattr(broker, field)["t"] == 1
    # When the wait is cancelled
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Then the start is taken back (it crashed nothing) and the gate is left
    assert getattr(broker, field)["t"] == 0 and not q.gate.cohort and q.gate.running == 0


async def test_a_worker_holds_its_slots_plus_its_read_ahead_and_reclaims_one_worker_more() -> None:
    # Given 4 slots and a read-ahead of half as many again (2 trajectories waiting for a slot)
    table = InFlightTable(4, read_ahead=0.5)
    assert (table.bound, table.room(), table.reclaim_room()) == (6, 6, 12)
    # When it holds 6: the readers stop, a reclaim still has one worker's worth
    for i in range(6):
        table.hold(0, f"t{i}")
    assert not table.capacity.is_set() and table.room() == 0 and table.reclaim_room() == 6
    # and a reclaim that took it leaves the readers stopped until the worker is below its bound again
    for i in range(6, 12):
        table.hold(0, f"t{i}")
    assert table.reclaim_room() == 0 and table.room() == 0
    for i in range(7):
        table.finished(f"t{i}")
    assert table.capacity.is_set() and table.room() == 1
    # a stopping worker reclaims nothing
    table.stop_admitting()
    assert table.reclaim_room() == 0


async def test_a_busy_worker_reads_again_once_half_its_read_ahead_is_free() -> None:
    table = InFlightTable(4, read_ahead=1)  # 4 slots, 4 waiting: reads in batches of 2 or more
    for i in range(8):
        table.hold(0, f"t{i}")
    table.finished("t0")
    assert not table.capacity.is_set() and table.room() == 1
    table.finished("t1")
    assert table.capacity.is_set() and table.room() == 2


async def test_read_ahead_rounds_up_and_zero_holds_only_what_it_scores() -> None:
    assert InFlightTable(3, read_ahead=0.1).bound == 4
    assert InFlightTable(3, read_ahead=0).bound == 3
    assert InFlightTable(3, read_ahead=2).bound == 9


async def test_resting_trajectories_at_their_bound_stop_reclaims_too() -> None:
    table = InFlightTable(2, max_resting=1, read_ahead=1)
    table.hold(0, "a")
    table.rest("a")
    assert table.room() == 0 and table.reclaim_room() == 0


def test_a_read_asks_for_no_more_than_its_loops_share_of_the_openings() -> None:
    openings = [10]

    def reader(loops: int) -> StreamReader:
        return StreamReader(
            None,  # type: ignore[arg-type]  # asks() sends nothing
            handle=None,  # type: ignore[arg-type]
            stopping=asyncio.Event(),
            capacity=asyncio.Event(),
            openings=lambda: openings[0],
            loops=loops,
            batch_size=256,
            block_ms=None,
            namespace="t",
            redis_url="redis://x",
            room=None,  # type: ignore[arg-type]
        )

    assert reader(1).asks(256) == 10
    assert reader(3).asks(256) == 4  # ceil(10 / 3): at most 12 over the three loops
    assert reader(1).asks(5) == 5  # the bytes-per-read count when it is smaller
    openings[0] = 0
    assert reader(1).asks(256) == 1  # never zero (a reader only reads once capacity is set)


def test_a_reclaim_takes_the_entries_of_the_first_trajectories_only() -> None:
    ids = ["1-0", "2-0", "3-0", "4-0", "5-0", "6-0"]
    tids = {"1-0": b"a", "2-0": b"b", "3-0": b"a", "4-0": b"", "5-0": b"c", "6-0": b"b"}
    assert first_trajectories(ids, tids, 2) == ["1-0", "2-0", "3-0", "6-0"]  # every entry of a and b
    assert first_trajectories(ids, tids, 3) == ["1-0", "2-0", "3-0", "4-0", "6-0"]  # 4-0 names none: one of its own
    assert first_trajectories(ids, tids, 0) == []
    assert first_trajectories(ids, tids, 10) == ids


async def test_records_a_batch_held_back_are_handled_with_the_next_read_or_filed_when_none_follows() -> None:
    from rewardq.queue.entries import Entry

    async def run(batches: list[int]) -> tuple[list[tuple[int, list[str], bool]], list[tuple[int, int | None]]]:
        stopping, capacity = asyncio.Event(), asyncio.Event()
        capacity.set()
        reads: list[tuple[int, int | None]] = []
        calls: list[tuple[int, list[str], bool]] = []

        class Broker:
            async def read(self, shards: list[int], count: int, block_ms: int | None) -> list[Entry]:
                reads.append((count, block_ms))
                if len(reads) == len(batches):
                    stopping.set()
                return [Entry(0, f"{len(reads)}-{i}", {}) for i in range(batches[len(reads) - 1])]

        async def handle(entries: list[Entry], carried: list[str], full: set[int]) -> list[str]:
            calls.append((len(entries), list(carried), full == {0}))
            return [f"held-{len(calls)}"] if full else []  # the stand-in holds one record back when it may

        reader = StreamReader(
            Broker(),  # type: ignore[arg-type]  # a stand-in broker
            handle=handle,  # type: ignore[arg-type]  # held-back records are opaque to the reader
            stopping=stopping,
            capacity=capacity,
            openings=lambda: 4,
            loops=1,
            batch_size=4,
            block_ms=500,
            namespace="t",
            redis_url="redis://x",
            room=None,  # type: ignore[arg-type]
        )
        await asyncio.wait_for(reader.run([0]), 5)
        return calls, reads

    # a full read may hold back; the read after it does not block; one that finds nothing files them
    calls, reads = await run([4, 4, 0])
    assert calls == [(4, [], True), (4, ["held-1"], True), (0, ["held-2"], False)]
    assert reads == [(4, 500), (4, None), (4, None)]
    # a short read holds nothing back
    calls, reads = await run([4, 1, 0])
    assert calls == [(4, [], True), (1, ["held-1"], False)] and reads[-1] == (4, 500)
    # the worker stops: what the last batch held back is filed
    calls, _ = await run([4])
    assert calls == [(4, [], True), (0, ["held-1"], False)]


def test_only_the_trailing_partial_trajectory_of_a_full_stream_is_held_back() -> None:
    from types import SimpleNamespace

    from rewardq.consumers.intake import trailing_partials
    from rewardq.consumers.reader import full_streams
    from rewardq.queue.entries import Entry

    def item(shard: int, tid: str, index: int, final: bool = False, deliveries: int = 1) -> Any:
        rec = SimpleNamespace(tid=tid, index=index, final=final)
        return (Entry(shard, f"{tid}-{index}", {}, deliveries), rec, b"")

    a = [item(0, "a", 0), item(0, "a", 1, final=True)]
    b = [item(0, "b", 0), item(0, "b", 1)]  # cut short by the read
    c = [item(1, "c", 0)]  # shard 1's stream was not full
    new = a + b + c
    assert full_streams([it[0] for it in new], 4) == {0}
    assert trailing_partials([], new, 64, {0}) == b
    assert trailing_partials([], new, 64, {0, 1}) == b + c
    assert trailing_partials(b[:1], [b[1]], 64, {0}) == b  # held back again, with what the last read held
    assert trailing_partials([], b, 2, {0}) == []  # as many outputs as max_outputs: filed
    assert trailing_partials([], [item(0, "d", 1)], 64, {0}) == []  # not from output 0
    assert trailing_partials([], [item(0, "e", 0, deliveries=2)], 64, {0}) == []  # a redelivery
    assert trailing_partials([], a, 64, {0}) == []  # ends with its final output


def test_a_trailing_partial_trajectory_is_held_back_only_within_its_bounds() -> None:
    from types import SimpleNamespace

    from rewardq.consumers.intake import HOLD_MAX_BYTES, HOLD_MAX_RECORDS, trailing_partials
    from rewardq.queue.entries import Entry

    def outputs(tid: str, n: int, size: int = 0) -> list[Any]:
        return [
            (Entry(0, f"{tid}-{i}", {}), SimpleNamespace(tid=tid, index=i, final=False), b"x" * size) for i in range(n)
        ]

    # as many records as the bound: held; one more: filed as they come
    assert len(trailing_partials([], outputs("a", HOLD_MAX_RECORDS), 4096, {0})) == HOLD_MAX_RECORDS
    assert trailing_partials([], outputs("b", HOLD_MAX_RECORDS + 1), 4096, {0}) == []
    # the records' bytes: up to the bound held, past it filed (however few the records)
    size = HOLD_MAX_BYTES // 2
    assert len(trailing_partials([], outputs("c", 2, size), 4096, {0})) == 2
    assert trailing_partials([], outputs("d", 3, size), 4096, {0}) == []
    # what an earlier read held counts too
    held = outputs("e", 3, size)
    assert trailing_partials(held[:2], held[2:], 4096, {0}) == []
