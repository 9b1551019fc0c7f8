"""The fleet's stage lease (``lua/stage.lua`` through :class:`StageLease`): one chunked commit
stages at a time, a waiter waits, a dead holder's staged keys are deleted by the next taker.

The lease's logic runs on fakeredis (its scripts without their shebang); that the lease is
allowed past ``maxmemory`` and that several real workers then score every key is shown on a
real Redis in ``tests/integration/test_redis_memory.py``.
"""

from __future__ import annotations

import asyncio

import fakeredis
import pytest

from rewardq.consumers.metrics import NoMetrics
from rewardq.consumers.retries import RoomWaits
from rewardq.consumers.stage_lease import StageLease
from rewardq.queue import commit_calls as commit_calls_module
from rewardq.queue.broker import StreamBroker
from rewardq.queue.keys import Keyspace


def _broker(server: fakeredis.FakeServer, worker: str) -> StreamBroker:
    client = fakeredis.FakeAsyncRedis(server=server, decode_responses=False)
    return StreamBroker(client, Keyspace("sl", 2), worker=worker)


def _lease(broker: StreamBroker, stats: dict[str, int]) -> StageLease:
    return StageLease(broker, RoomWaits(metrics=NoMetrics(), stats=stats, base=0.001, cap=0.01), stats)


async def test_a_second_commit_waits_for_the_first_to_give_the_lease_back() -> None:
    server = fakeredis.FakeServer()
    a, b = _broker(server, "wa"), _broker(server, "wb")
    stats_b: dict[str, int] = {}
    order: list[str] = []
    # Given worker a holding the lease (shard 1: one Redis has one lease, shard 0's)
    async with _lease(a, {}).held(1, "p:a:", "the commit of a") as held_a:
        await held_a.staging(3)

        async def second() -> None:
            async with _lease(b, stats_b).held(0, "p:b:", "the commit of b"):
                order.append("b staged")

        # When worker b asks for it meanwhile
        task = asyncio.create_task(second())
        await asyncio.sleep(0.1)
        order.append("a done")
    await asyncio.wait_for(task, 5)
    # Then b staged only after a gave it back, and counted one wait
    assert order == ["a done", "b staged"]
    assert stats_b["stage_waits"] == 1
    assert await a.r.exists(a.ks.stage_lease(0)) == 0


async def test_a_stale_lease_is_taken_over_and_its_staged_keys_deleted() -> None:
    server = fakeredis.FakeServer()
    a, b = _broker(server, "wa"), _broker(server, "wb")
    prefix = a.ks.staged(0, "u_s", "dead")
    # Given a holder that staged keys 0..2 and then stopped renewing (its lease is past its time)
    for i in range(4):
        await a.r.set(f"{prefix}{i}", b"x" * 10)
    assert await a.stage_lease(0, "take", "dead-token", prefix=prefix, staged=3) == (True, "0")
    await a.r.hset(a.ks.stage_lease(0), "until", "0")  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
    # When another worker takes it
    held, deleted = await b.stage_lease(0, "take", "b-token", prefix="p:b:")
    # Then it holds it, and the stale holder's staged keys are gone (key 3 was never named)
    assert held and deleted == "3"
    assert [await a.r.exists(f"{prefix}{i}") for i in range(4)] == [0, 0, 0, 1]
    # And the old holder learns it lost it: its renewal and release change nothing
    assert (await a.stage_lease(0, "renew", "dead-token", staged=4))[0] is False
    assert (await a.stage_lease(0, "release", "dead-token"))[0] is False
    assert await b.r.hget(b.ks.stage_lease(0), "token") == b"b-token"  # type: ignore[misc]  # as above


async def test_a_live_holder_keeps_its_lease_by_renewing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit_calls_module, "STAGE_LEASE_SECONDS", 0.3)
    monkeypatch.setattr("rewardq.consumers.stage_lease.STAGE_LEASE_SECONDS", 0.3)
    server = fakeredis.FakeServer()
    a, b = _broker(server, "wa"), _broker(server, "wb")
    # Given a holder that stages for three lease lifetimes (its keeper renews every third of one)
    async with _lease(a, {}).held(0, "p:a:", "the commit of a") as held_a:
        await asyncio.sleep(0.9)
        # Then nobody could take it meanwhile
        assert (await b.stage_lease(0, "take", "b-token"))[0] is False
        assert not held_a.lost
