"""Crash recovery, leases, idempotent commits, incomplete trajectories (in-process workers, real Redis)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tensordict import TensorDict

from rewardq import RewardClient
from rewardq.consumers.worker import Worker
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RESULT_FIELDS, RewardResult
from rewardq.reward.base import RewardManager
from tests.support.helpers import (
    SAMPLE,
    Hang,
    open_test_worker,
    output,
    running_workers,
    stop_while_scoring,
    until,
    until_in_flight,
    worker_config,
)
from tests.support.helpers import abandon_worker as _abandon
from tests.support.managers import LengthManager
from tests.support.sync_client import SyncClient


async def test_dead_workers_trajectory_is_reclaimed_and_scored_once(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = client.put_trajectory("u", "s", [output(3, 4), output(3, 6)], SAMPLE)
    a = await open_test_worker(worker_config(ns, redis_url, name="A"), manager=Hang(None))
    entries = await a.broker.read([0], 10, None)
    await a.handle(entries)
    assert list(a.in_flight) == ["u_s"]
    await _abandon(a)  # A dies while scoring; its lease runs out after lease_seconds=2
    LengthManager.calls = []
    async with running_workers(ns, redis_url, [LengthManager(None)], max_deliveries=10) as (b,):
        res = await asyncio.to_thread(client.wait_rewards, keys, 20)
    assert [r.reward_score for r in res.values()] == [6.0, 6.0]
    assert {r.worker for r in res.values()} == {"w0"}
    assert len(LengthManager.calls) == 1
    assert sync_redis.xlen(ks.done(0)) == 1
    assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0
    client.close()


async def test_live_lease_is_respected_while_owner_renews(ns: str, redis_url: str) -> None:
    """A slow but alive scorer keeps its trajectory: nobody else scores it concurrently."""

    class Slow(RewardManager):
        async def run_single(self, data: TensorDict) -> dict[str, Any]:
            await asyncio.sleep(4.0)  # longer than claim_idle and lease_seconds
            return {"reward_score": 1.0, "reward_extra_info": {}}

    client = RewardClient.from_url(redis_url, namespace=ns)
    # (three outputs: the renewal keeps every entry of the trajectory fresh, not only the first)
    keys = client.put_trajectory("slow", "s", [output(2, 2), output(2, 3), output(2, 4)], SAMPLE)
    LengthManager.calls = []
    async with running_workers(ns, redis_url, [Slow(None)]) as (a,):
        await until_in_flight(a)  # the slow worker has taken it ...
        # ... and a second worker, started now, would reclaim it after claim_idle if the lease lapsed
        async with running_workers(ns, redis_url, [LengthManager(None)], name_prefix="b"):
            res = await asyncio.to_thread(client.wait_rewards, keys, 20)
        assert a.stats["reclaimed"] == 0  # nor did its own worker take its entries back as idle ones
    assert {(r.reward_score, r.worker) for r in res.values()} == {(1.0, "w0")}
    assert LengthManager.calls == []  # the second worker never scored it
    client.close()


async def test_graceful_stop_hands_back_and_another_worker_finishes(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = client.put_trajectory("h", "s", [output(2, 3), output(2, 5)], SAMPLE)
    # returns normally: hands the trajectory back instead of hanging
    await stop_while_scoring(worker_config(ns, redis_url, name="A", shutdown_grace=0.2, claim_idle=30.0))
    assert not sync_redis.hget(Keyspace(ns).traj_key("h_s"), "lease")
    # claim_idle is 30 s, yet every handed-back entry is picked up at once
    async with running_workers(ns, redis_url, [LengthManager(None)], claim_idle=30.0):
        res = await asyncio.to_thread(client.wait_rewards, keys, 10)
    assert [r.reward_score for r in res.values()] == [5.0, 5.0]
    client.close()


@contextlib.asynccontextmanager
async def stored_trajectory(
    ns: str, url: str, uid: str, outputs: list[dict[str, Any]]
) -> AsyncIterator[tuple[RewardClient, Worker, list[Any]]]:
    """Put a trajectory ``<uid>_s``, read and store it with a started worker "A" (which
    never scores on its own); yields ``(client, worker, store outcomes)``."""
    from rewardq.queue.codec import decode_output

    client = RewardClient.from_url(url, namespace=ns)
    client.put_trajectory(uid, "s", outputs, SAMPLE)
    w = await open_test_worker(worker_config(ns, url, name="A"), manager=Hang(None))
    try:
        entries = await w.broker.read([0], 10, None)
        yield client, w, await w.broker.store([(e, decode_output(e.data), bytes(e.data)) for e in entries])
    finally:
        await w.stop()
        client.close()


async def test_repeated_commit_changes_nothing(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    ks = Keyspace(ns)
    async with stored_trajectory(ns, redis_url, "c", [output(2, 2), output(2, 3)]) as (client, w, outs):
        assert [o.kind for o in outs] == ["parked", "complete"]
        results = [
            RewardResult(key=f"c_s_{i}", status="ok", reward_score=0.5, reward_extra_info={"i": i}, worker="A")
            for i in range(2)
        ]
        assert await w.broker.commit(0, "c_s", results) is True
        first = sync_redis.hgetall(ks.reward_key("c_s_1"))
        results[1].reward_score = 0.9  # a late duplicate commit with another value
        assert await w.broker.commit(0, "c_s", results) is False
        assert sync_redis.hgetall(ks.reward_key("c_s_1")) == first
        assert sync_redis.xlen(ks.done(0)) == 1
        assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0
        # a redelivered record of a finished trajectory is acked and changes nothing
        from rewardq.queue.codec import decode_output

        client.put_output("c", "s", 1, output(2, 3), SAMPLE, final=True)
        outs = await w.broker.store(
            [(e, decode_output(e.data), bytes(e.data)) for e in await w.broker.read([0], 10, None)]
        )
        assert [o.kind for o in outs] == ["done"]
        assert sync_redis.hgetall(ks.reward_key("c_s_1")) == first


async def test_missing_indices_are_named_for_a_trajectory_of_more_than_half_max_outputs(
    ns: str, redis_url: str
) -> None:
    # every stored output keeps its record and its digest in the trajectory hash: 2 fields each
    client = RewardClient.from_url(redis_url, namespace=ns, max_outputs=50)
    for i in range(40):
        if i != 7:
            client.put_output("wide", "s", i, output(2, 2), SAMPLE, final=i == 39)
    async with running_workers(ns, redis_url, [LengthManager(None)], incomplete_timeout=1.0, max_outputs=50):
        res = await asyncio.to_thread(client.wait_rewards, ["wide_s_0", "wide_s_39"], 10)
    assert all(r.status == "error" for r in res.values())
    assert "missing output indices 7 of 0..39" in (res["wide_s_0"].error or ""), res["wide_s_0"].error


async def test_incomplete_trajectory_ends_with_error_naming_missing_indices(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    client.put_output("gap", "s", 0, output(2, 2), SAMPLE)
    client.put_output("gap", "s", 3, output(2, 2), SAMPLE, final=True)  # 1 and 2 never arrive
    client.put_output("nofinal", "s", 0, output(2, 2), SAMPLE)  # final never arrives
    async with running_workers(ns, redis_url, [LengthManager(None)], incomplete_timeout=1.0) as (w,):
        for _ in range(20):
            await asyncio.sleep(0.1)
            if sync_redis.zcard(ks.waiting(0)) == 2:
                break
        assert sync_redis.zcard(ks.waiting(0)) == 2  # visible while waiting
        res = await asyncio.to_thread(client.wait_rewards, [f"gap_s_{i}" for i in range(4)] + ["nofinal_s_0"], 10)
        # an output arriving after its trajectory ended still gets an answer
        client.put_output("gap", "s", 2, output(2, 2), SAMPLE)
        late = await asyncio.to_thread(client.wait_rewards, ["gap_s_2"], 10)
    assert all(r.status == "error" for r in res.values())
    assert "missing output indices 1,2 of 0..3" in (res["gap_s_0"].error or "")
    assert res["gap_s_1"].error == res["gap_s_0"].error
    assert "final output never arrived (have indices 0)" in (res["nofinal_s_0"].error or "")
    assert late["gap_s_2"].error == res["gap_s_0"].error  # its existing result is kept
    dead = [f for _, f in sync_redis.xrange(ks.dead(0))]
    assert sorted((f[b"tid"], f[b"kind"]) for f in dead) == [
        (b"gap_s", b"conflict"),  # the late output: dead-lettered, not dropped silently
        (b"gap_s", b"incomplete"),
        (b"nofinal_s", b"incomplete"),
    ]
    late_dead = next(f for f in dead if f[b"kind"] == b"conflict")
    assert b"output 2 arrived after its trajectory finished" in late_dead[b"reason"]
    assert late_dead[b"key"] == b"gap_s_2"
    assert sync_redis.zcard(ks.waiting(0)) == 0
    client.close()


async def test_entry_redelivered_too_often_is_dead_lettered(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = client.put_trajectory("poison", "s", [output(2, 2)], SAMPLE)
    # three workers in a row die while scoring it
    for i in range(3):
        a = await open_test_worker(
            worker_config(ns, redis_url, name=f"dies{i}", lease_seconds=0.5, heartbeat_interval=0.1), manager=Hang(None)
        )
        if i == 0:
            await a.handle(await a.broker.read([0], 10, None))
        else:
            await asyncio.sleep(1.1)
            await a.maintain()
        assert a.in_flight, f"worker {i} should have taken the trajectory"
        await _abandon(a)
    await asyncio.sleep(1.1)
    async with running_workers(ns, redis_url, [LengthManager(None)], max_deliveries=3):
        res = await asyncio.to_thread(client.wait_rewards, keys, 10)
    assert res[keys[0]].status == "error" and "delivered 4 times" in (res[keys[0]].error or "")
    (dead,) = [f for _, f in sync_redis.xrange(ks.dead(0))]
    assert dead[b"kind"] == b"exhausted" and dead[b"deliveries"] == b"4"
    client.close()


async def test_deleted_stream_is_recreated_and_work_goes_on(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    """An operator deletes the stream under a blocked reader: the worker re-creates it and carries on."""
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    async with running_workers(ns, redis_url, [LengthManager(None)], block_ms=2000):
        await asyncio.sleep(0.3)
        sync_redis.delete(ks.stream(0))
        await asyncio.sleep(0.3)
        keys = client.put_trajectory("after", "s", [output(2, 3)], SAMPLE)
        res = await asyncio.to_thread(client.wait_rewards, keys, 10)
    assert res[keys[0]].reward_score == 3.0
    client.close()


async def test_dead_owners_lease_running_out_costs_no_deliveries(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    """claim_idle far below lease_seconds: the entry is not reclaimed (and counted) again and
    again while the dead owner's lease runs out, so it is scored, not dead-lettered."""
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = client.put_trajectory("patient", "s", [output(2, 7)], SAMPLE)
    a = await open_test_worker(worker_config(ns, redis_url, name="A", lease_seconds=2.5), manager=Hang(None))
    await a.handle(await a.broker.read([0], 10, None))
    await _abandon(a)
    async with running_workers(
        ns, redis_url, [LengthManager(None)], claim_idle=0.3, heartbeat_interval=0.1, max_deliveries=2
    ) as (b,):
        res = await asyncio.to_thread(client.wait_rewards, keys, 15)
    assert res[keys[0]].status == "ok" and res[keys[0]].reward_score == 7.0
    assert sync_redis.xlen(Keyspace(ns).dead(0)) == 0
    client.close()


@pytest.mark.parametrize("shared", [True, False], ids=["one-result-for-every-key", "one-result-per-key"])
async def test_commit_writes_each_key_its_result_whether_shared_or_per_key(
    ns: str, redis_url: str, sync_redis: SyncClient, shared: bool
) -> None:
    # Given a complete trajectory of three outputs held by a worker
    ks = Keyspace(ns)
    async with stored_trajectory(ns, redis_url, "sh", [output(2, 2), output(2, 3), output(3, 1)]) as (client, w, outs):
        assert [o.kind for o in outs] == ["parked", "parked", "complete"]
        # When it commits one result copied to every key (the built-in managers), or one per key
        extra = {"acc": 1.0, "pred": "42"}
        results = [
            RewardResult(
                key=f"sh_s_{i}",
                status="ok",
                reward_score=1.0 if shared else float(i),
                reward_extra_info=extra if shared else {"i": i},
                worker="A",
                manager="m",
                scored_at=1700000000.5,
                latency_ms=3.25,
            )
            for i in range(3)
        ]
        ((_, args),) = w.broker.commit_calls(0, "sh_s", w.broker.encode(results))
        assert await w.broker.commit(0, "sh_s", results) is True
        # Then every key holds its own result, read back through the client
        got = client.get_rewards([f"sh_s_{i}" for i in range(3)])
        for i in range(3):
            r = got[f"sh_s_{i}"]
            assert r is not None and r.key == f"sh_s_{i}" and r.status == "ok" and r.worker == "A"
            assert r.reward_score == (1.0 if shared else float(i))
            assert r.reward_extra_info == (extra if shared else {"i": i})
            assert r.latency_ms == 3.25 and r.manager == "m"
        # And a shared result went over the wire once, not once per key (16 fixed arguments, the field
        # names, the row count, a value per field and row)
        nf = len(RESULT_FIELDS)
        assert len(args) == 16 + nf + 1 + nf * (1 if shared else 3)
        done = sync_redis.xrange(ks.done(0))
        assert len(done) == 1 and done[0][1][b"latency_ms"] == b"3.250" and done[0][1][b"n"] == b"3"
        assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0


async def test_a_commit_another_worker_made_first_counts_a_duplicate_not_a_scored_trajectory(
    ns: str, redis_url: str
) -> None:
    """A worker whose lease lapsed scores on; another worker's commit came first, so its own commit
    writes nothing: its counters say duplicate, and ``scored`` counts only results it wrote."""
    go = asyncio.Event()

    class Late(RewardManager):
        async def run_single(self, data: TensorDict) -> dict[str, Any]:
            await go.wait()
            return {"reward_score": 0.25, "reward_extra_info": {}}

    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = client.put_trajectory("late", "s", [output(2, 2), output(2, 3)], SAMPLE)
    async with running_workers(ns, redis_url, [Late(None)]) as (w,):
        await until_in_flight(w)
        # Given another worker's results committed while this one still scores the trajectory
        first = [RewardResult(key=k, status="ok", reward_score=1.0, reward_extra_info={}, worker="other") for k in keys]
        assert await w.broker.commit(0, "late_s", first) is True
        # When this worker's scoring ends and its commit finds the trajectory finished
        go.set()
        await until(lambda: w.stats["duplicates"] >= 1, f"worker {w.name} to count the duplicate commit")
        # Then the first results stand, and this worker counted a duplicate, not a scored trajectory
        res = await asyncio.to_thread(client.wait_rewards, keys, 10)
        assert {(r.reward_score, r.worker) for r in res.values()} == {(1.0, "other")}
        assert (w.stats["scored"], w.stats["duplicates"], w.stats["errors"]) == (0, 1, 0)
    client.close()
