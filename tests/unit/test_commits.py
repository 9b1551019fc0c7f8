"""CommitCoalescer: commits of one event-loop turn share a round trip; each keeps its own outcome.

The broker here is a recorder (the coalescing is pure asyncio); the real ``commit_many``
against Redis runs in every pipeline, recovery and fault test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from rewardq.consumers.commits import CommitCoalescer


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
    c = CommitCoalescer(broker)  # type: ignore[arg-type]  # a stand-in broker
    got = await asyncio.gather(*(c.commit(0, f"t{i}", []) for i in range(4)), return_exceptions=True)
    # the first finds nothing on the wire and goes at once; the rest of the turn go together
    assert broker.calls == [["t0"], ["t1", "t2", "t3"]]
    assert got[0] is True and got[1] is False and got[3] is True
    assert isinstance(got[2], ResponseError)  # only its own waiter sees a script's error
    # a later turn is a new round trip, sent at once
    assert await c.commit(0, "t9", []) is True
    assert broker.calls[-1] == ["t9"]


async def test_commits_arriving_while_a_batch_is_out_form_the_next_batch() -> None:
    broker = RecordingBroker(delay=0.02)
    c = CommitCoalescer(broker)  # type: ignore[arg-type]  # a stand-in broker
    first = asyncio.create_task(c.commit(0, "a", []))
    await asyncio.sleep(0.005)  # "a" is on the wire
    second = [asyncio.create_task(c.commit(0, t, [])) for t in ("b", "c")]
    await asyncio.sleep(0.005)
    third = asyncio.create_task(c.commit(0, "d", []))  # "b", "c" are on the wire
    assert await asyncio.gather(first, *second, third) == [True] * 4
    assert broker.calls == [["a"], ["b", "c"], ["d"]]
    await c.drain()


async def test_a_failed_round_trip_reaches_every_waiter_of_that_batch() -> None:
    c = CommitCoalescer(RecordingBroker(fail=RedisConnectionError("gone")))  # type: ignore[arg-type]  # a stand-in broker
    got = await asyncio.gather(c.commit(0, "a", []), c.commit(1, "b", []), return_exceptions=True)
    assert all(isinstance(g, RedisConnectionError) for g in got)


async def test_a_cancelled_waiter_drops_out_and_drain_waits_for_the_sent() -> None:
    broker = RecordingBroker(delay=0.05)
    c = CommitCoalescer(broker)  # type: ignore[arg-type]  # a stand-in broker
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
