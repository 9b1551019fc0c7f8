"""CommitCoalescer: commits of one event-loop turn share a round trip; each keeps its own outcome.

The broker here is a recorder (the coalescing is pure asyncio); the real ``commit_many``
against Redis runs in every pipeline, recovery and fault test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError

from rewardq.consumers.commits import ByteGate, CommitCoalescer
from rewardq.consumers.metrics import NoMetrics
from rewardq.consumers.retries import NoRoom, RoomWaits


def _room() -> RoomWaits:
    return RoomWaits(metrics=NoMetrics(), stats={}, base=0.001, cap=0.002)


class Encoded:
    """Stands in for EncodedResults: the coalescer only reads the bytes a commit writes."""

    def __init__(self, written_bytes: int = 0) -> None:
        self.written_bytes = written_bytes


class RecordingBroker:
    commit_bytes = 1000

    def __init__(
        self, replies: dict[str, bool | Exception] | None = None, fail: BaseException | None = None, delay: float = 0.0
    ) -> None:
        self.calls: list[list[str]] = []
        self.replies = replies or {}
        self.fail = fail
        self.delay = delay

    def encode(self, results: object) -> Encoded:
        return results if isinstance(results, Encoded) else Encoded()

    async def commit_many(self, items: Sequence[tuple[int, str, object]]) -> list[bool | Exception]:
        self.calls.append([tid for _, tid, _ in items])
        await asyncio.sleep(self.delay)  # a round trip always yields to the loop
        if self.fail is not None:
            raise self.fail
        return [self.replies.get(tid, True) for _, tid, _ in items]

    async def commit(self, shard: int, tid: str, results: object) -> bool:
        reply = (await self.commit_many([(shard, tid, results)]))[0]
        if isinstance(reply, Exception):
            raise reply
        return reply


async def test_commits_of_one_turn_go_in_one_call_and_keep_their_replies() -> None:
    broker = RecordingBroker(replies={"t1": False, "t2": ResponseError("BUSY script")})
    c = CommitCoalescer(broker, _room())  # type: ignore[arg-type]  # a stand-in broker
    got = await asyncio.gather(*(c.commit(0, f"t{i}", []) for i in range(4)), return_exceptions=True)
    # the first finds nothing on the wire and goes at once; the rest of the turn go together
    assert broker.calls == [["t0"], ["t1", "t2", "t3"]]
    assert got[0] is True and got[1] is False and got[3] is True
    assert isinstance(got[2], ResponseError)  # only its own waiter sees a script's error
    # a later turn is a new round trip, sent at once
    assert await c.commit(0, "t9", []) is True
    assert broker.calls[-1] == ["t9"]


class GatedBroker(RecordingBroker):
    """A recorder whose round trips stay out until the test lets each one answer: ``sent``
    is set when a call goes out, and ``answer()`` releases the oldest call still out."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = asyncio.Event()
        self._gates: list[asyncio.Event] = []

    async def commit_many(self, items: Sequence[tuple[int, str, object]]) -> list[bool | Exception]:
        self.calls.append([tid for _, tid, _ in items])
        gate = asyncio.Event()
        self._gates.append(gate)
        self.sent.set()
        await gate.wait()
        return [True for _ in items]

    async def next_call(self) -> list[str]:
        """Wait until a round trip is on the wire; the tids it carries."""
        await self.sent.wait()
        self.sent.clear()
        return self.calls[-1]

    def answer(self) -> None:
        self._gates.pop(0).set()


async def test_commits_arriving_while_a_batch_is_out_form_the_next_batch() -> None:
    broker = GatedBroker()
    c = CommitCoalescer(broker, _room())  # type: ignore[arg-type]  # a stand-in broker
    first = asyncio.create_task(c.commit(0, "a", []))
    assert await broker.next_call() == ["a"]  # "a" is on the wire
    second = [asyncio.create_task(c.commit(0, t, [])) for t in ("b", "c")]
    broker.answer()  # "a" answers; "b" and "c" arrived while it was out and go together
    assert await broker.next_call() == ["b", "c"]
    third = asyncio.create_task(c.commit(0, "d", []))  # arrives while "b", "c" are on the wire
    broker.answer()
    assert await broker.next_call() == ["d"]
    broker.answer()
    assert await asyncio.gather(first, *second, third) == [True] * 4
    assert broker.calls == [["a"], ["b", "c"], ["d"]]
    await c.drain()


async def test_a_failed_round_trip_reaches_every_waiter_of_that_batch() -> None:
    c = CommitCoalescer(RecordingBroker(fail=RedisConnectionError("gone")), _room())  # type: ignore[arg-type]  # a stand-in broker
    got = await asyncio.gather(c.commit(0, "a", []), c.commit(1, "b", []), return_exceptions=True)
    assert all(isinstance(g, RedisConnectionError) for g in got)


async def test_a_cancelled_waiter_drops_out_and_drain_waits_for_the_sent() -> None:
    broker = RecordingBroker(delay=0.05)
    c = CommitCoalescer(broker, _room())  # type: ignore[arg-type]  # a stand-in broker
    keep = asyncio.create_task(c.commit(0, "keep", []))
    gone = asyncio.create_task(c.commit(0, "gone", []))
    await asyncio.sleep(0)  # both queued in this turn
    gone.cancel()
    for _ in range(5):  # the flush runs, then its send starts: only the live waiter goes
        await asyncio.sleep(0)
    assert broker.calls == [["keep"]]
    await c.drain()
    assert keep.done() and keep.result() is True
    with pytest.raises(asyncio.CancelledError):
        await gone


class FullBroker(RecordingBroker):
    """A recorder whose Redis is past maxmemory for its first ``full`` script calls."""

    def __init__(self, full: int) -> None:
        super().__init__()
        self.full = full

    async def commit_many(self, items: Sequence[tuple[int, str, object]]) -> list[bool | Exception]:
        self.calls.append([tid for _, tid, _ in items])
        await asyncio.sleep(0)
        out: list[bool | Exception] = []
        for _ in items:
            self.full -= 1
            out.append(OutOfMemoryError("OOM allow-oom flag is not set on the script") if self.full >= 0 else True)
        return out


async def test_a_commit_refused_past_maxmemory_is_sent_again_until_it_goes_through() -> None:
    # Given a Redis that refuses the first three commit scripts for want of memory
    broker = FullBroker(full=3)
    stats: dict[str, int] = {}
    room = RoomWaits(metrics=NoMetrics(), stats=stats, base=0.001, cap=0.002)
    c = CommitCoalescer(broker, room)  # type: ignore[arg-type]  # a stand-in broker
    # When two trajectories commit
    got = await asyncio.gather(c.commit(0, "a", []), c.commit(0, "b", []))
    # Then both are written in the end, every refusal was counted, and the episode is over
    assert list(got) == [True, True]
    assert stats["redis_full"] == 3 and room.since is None
    assert [t for call in broker.calls for t in call].count("a") >= 2


async def test_a_commit_that_never_finds_room_gives_up_after_its_patience() -> None:
    # Given a Redis that refuses every commit for want of memory, and a coalescer that waits 0.05 s
    broker = FullBroker(full=10**9)
    stats: dict[str, int] = {}
    c = CommitCoalescer(broker, RoomWaits(metrics=NoMetrics(), stats=stats, base=0.001, cap=0.005), patience=0.05)  # type: ignore[arg-type]  # a stand-in broker
    # When a trajectory commits
    with pytest.raises(NoRoom) as gave_up:
        await c.commit(0, "a", [])
    # Then it was tried again for about its patience, then given up, saying what and how long
    assert gave_up.value.waited >= 0.05 and gave_up.value.refusals >= 2 and len(broker.calls) == gave_up.value.refusals
    assert "the commit of a" in str(gave_up.value) and "past its maxmemory" in str(gave_up.value)
    assert stats["no_room"] == 1 and stats["redis_full"] == gave_up.value.refusals - 1


async def test_a_commit_failing_for_another_reason_is_not_sent_again() -> None:
    c = CommitCoalescer(RecordingBroker(replies={"a": ResponseError("ERR no such key")}), _room())  # type: ignore[arg-type]  # a stand-in broker
    with pytest.raises(ResponseError, match="no such key"):
        await c.commit(0, "a", [])


async def test_the_byte_gate_holds_at_most_its_limit_in_order() -> None:
    gate = ByteGate(100)
    held: list[int] = []
    peak = 0
    order: list[str] = []

    async def load(name: str, n: int) -> None:
        nonlocal peak
        async with gate.hold(n):
            order.append(name)
            held.append(n)
            peak = max(peak, gate.used)
            await asyncio.sleep(0.01)

    # a load over the limit waits until it is alone; the ones queued behind it keep their turn
    await asyncio.gather(load("a", 60), load("big", 500), load("b", 30), load("c", 30))
    assert peak <= 100 and gate.used == 0
    assert order == ["a", "big", "b", "c"]


def test_reads_are_sized_by_the_bytes_of_the_last_read() -> None:
    from rewardq.consumers.reader import READ_BYTES, next_count
    from rewardq.queue.entries import Entry

    def entries(n: int, size: int) -> list[Entry]:
        return [Entry(0, f"{i}-0", {b"data": b"x" * size}) for i in range(n)]

    assert next_count(entries(3, 40_000), 256, 256) == 256  # ordinary records: the whole batch
    assert next_count(entries(1, 31_000_000), 256, 256) == 1  # 31 MB records: one at a time
    assert next_count(entries(2, 4 * 1024 * 1024), 256, 1) == READ_BYTES // (4 * 1024 * 1024)
    assert next_count([], 256, 1) == 1  # an empty read keeps the count


async def test_a_read_batch_refused_past_maxmemory_is_waited_out_and_reading_goes_on() -> None:
    from rewardq.consumers.reader import StreamReader
    from rewardq.queue.entries import Entry

    stopping, capacity = asyncio.Event(), asyncio.Event()
    capacity.set()
    handled: list[int] = []

    class OneBatchBroker:
        reads = 0

        async def read(self, shards: list[int], count: int, block_ms: int | None) -> list[Entry]:
            self.reads += 1
            if self.reads > 2:
                stopping.set()
                return []
            return [Entry(0, f"{self.reads}-0", {b"data": b"x"})]

    async def handle(entries: list[Entry], carried: object, full: object) -> list[Any]:
        handled.append(len(entries))
        if len(handled) == 1:  # the first batch's filing is refused for want of memory
            raise OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
        return []

    stats: dict[str, int] = {}
    room = RoomWaits(metrics=NoMetrics(), stats=stats, base=0.001, cap=0.002)
    reader = StreamReader(
        OneBatchBroker(),  # type: ignore[arg-type]  # a stand-in broker
        handle=handle,
        stopping=stopping,
        capacity=capacity,
        openings=lambda: 8,
        loops=1,
        batch_size=8,
        block_ms=None,
        namespace="t",
        redis_url="redis://x",
        room=room,
    )
    # the refusal neither ends the loop nor loses its place: it is counted, and the next batch is read
    await asyncio.wait_for(reader.run([0]), 5)
    assert handled == [1, 1] and stats["redis_full"] == 1
