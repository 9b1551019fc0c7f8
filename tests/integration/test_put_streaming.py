"""A batch of puts made at once (an agent-loop worker's ``asyncio.gather``) reaches Redis one call at a
time as each is encoded, not after the last one is (``AsyncRewardClient._prepare_and_send``), and a
burst larger than the client's connection pool, with records that go as blobs, still completes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from rewardq import AsyncRewardClient
from rewardq.errors import RewardTimeout
from rewardq.queue.blobs import BLOB_CHUNK_BYTES
from rewardq.queue.keys import Keyspace
from tests.support.helpers import SAMPLE, output
from tests.support.sync_client import SyncClient

ENCODE_S = 0.03  # what encoding one trajectory is made to take (a wall-clock stand-in for its CPU)
CALLS = 20


def slow_encoding(client: AsyncRewardClient, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Make each trajectory's encoding take ENCODE_S, blocking the event loop as real encoding does;
    returns the unix times at which each encoding began."""
    began: list[float] = []
    prepare = client._prepare_trajectory

    def slow(*args: Any) -> Any:
        began.append(time.time())
        time.sleep(ENCODE_S)
        return prepare(*args)

    monkeypatch.setattr(client, "_prepare_trajectory", slow)
    return began


def entry_ms(entry_id: bytes) -> int:
    return int(entry_id.split(b"-")[0])


@pytest.mark.parametrize("call", ["put_trajectory", "put_trajectory_and_wait"])
async def test_a_batch_of_puts_reaches_redis_while_the_rest_are_still_being_encoded(
    ns: str, redis_url: str, sync_redis: SyncClient, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    began = slow_encoding(client, monkeypatch)

    async def one(t: int) -> object:
        outs = [output(4, 3, seed=t), output(5, 2, seed=t + 1)]
        if call == "put_trajectory":
            return await client.put_trajectory(f"b{t}", "s", outs, SAMPLE)
        return await client.put_trajectory_and_wait(f"b{t}", "s", outs, SAMPLE, timeout=0.5)  # nobody scores

    # Given a client that has put before (its keyspace known: no first read in each call), and
    # CALLS trajectories put at once, each taking ENCODE_S of the event loop to encode
    await client.keyspace()
    got = await asyncio.gather(*(one(t) for t in range(CALLS)), return_exceptions=True)
    await client.aclose()
    if call == "put_trajectory_and_wait":
        assert all(isinstance(g, RewardTimeout) for g in got), got
    else:
        assert all(isinstance(g, list) for g in got), got
    # Then every trajectory went in, and the first one reached Redis (its entry id is Redis's clock)
    # before the last one began to be encoded: ~(CALLS - 1) x ENCODE_S = 0.57 s earlier here; when
    # every record was encoded before the first was written, it came after
    entries = sync_redis.xrange(Keyspace(ns).stream(0))
    assert len(entries) == 2 * CALLS and len(began) == CALLS
    first_in = entry_ms(entries[0][0]) / 1000
    assert first_in < max(began), (first_in, min(began), max(began))


async def test_a_burst_past_the_connection_pool_with_blob_records_completes(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    # Given a client of 2 connections and 12 trajectories put at once, every other one with a record
    # over the blob threshold (sent in pieces, on connections of its own)
    client = AsyncRewardClient.from_url(redis_url, namespace=ns, max_connections=2, pool_timeout=20)
    big = BLOB_CHUNK_BYTES // 4 + 1000  # int32 ids: over BLOB_CHUNK_BYTES once packed

    async def one(t: int) -> list[str]:
        outs = [output(4, 3, seed=t), output(5, big if t % 2 else 2, seed=t + 1)]
        return await client.put_trajectory(f"p{t}", "s", outs, SAMPLE)

    # When they are put, Then none waits for a connection that never comes: all are in
    keys = await asyncio.wait_for(asyncio.gather(*(one(t) for t in range(12))), timeout=60)
    await client.aclose()
    assert [k for ks in keys for k in ks] == [f"p{t}_s_{i}" for t in range(12) for i in range(2)]
    assert sync_redis.xlen(Keyspace(ns).stream(0)) == 24
    blobs = [e for _, e in sync_redis.xrange(Keyspace(ns).stream(0)) if b"blob" in e]
    assert len(blobs) == 6


async def test_the_keys_waited_for_are_the_keys_the_records_name(ns: str, redis_url: str) -> None:
    # Given names numpy gives (accepted wherever an int is), and more outputs than MAX_OUTPUTS allows
    # by default on a client that allows them: the waiter waits for the keys the records name
    client = AsyncRewardClient.from_url(redis_url, namespace=ns, max_outputs=6000)
    with pytest.raises(RewardTimeout) as err:
        await client.put_trajectory_and_wait(np.int64(7), "s", [output(3, 3), output(2, 2)], SAMPLE, timeout=0.3)
    assert err.value.missing == ["7_s_0", "7_s_1"]
    assert await client.put_output(np.int64(8), "s", np.int64(0), output(3, 3), SAMPLE, final=True) == "8_s_0"
    many = [output(1, 1, seed=i) for i in range(4100)]
    with pytest.raises(RewardTimeout) as err:
        await client.put_trajectory_and_wait("many", "s", many, SAMPLE, timeout=0.3)
    assert len(err.value.missing) == 4100 and err.value.missing[-1] == "many_s_4099"
    await client.aclose()


async def test_a_bad_name_is_refused_before_the_wait_begins(ns: str, redis_url: str) -> None:
    from rewardq.errors import RecordError

    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    with pytest.raises(RecordError, match="session_id"):
        await client.put_trajectory_and_wait("u", "has_underscore", [output(3, 3)], SAMPLE, timeout=30)
    with pytest.raises(RecordError, match="outputs"):
        await client.put_trajectory_and_wait("u", "s", [], SAMPLE, timeout=30)
    assert not client._watchers and client._watch_task is None  # nothing waited, no watcher started
    await client.aclose()


async def test_a_gathered_burst_holds_at_most_puts_in_flight_connections(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    from rewardq.producers.aio import PUTS_IN_FLIGHT

    # Given 300 trajectories put at once through one client (its pool may open 256 connections)
    client = AsyncRewardClient.from_url(redis_url, namespace=ns)
    await client.keyspace()
    await asyncio.gather(*(client.put_trajectory(f"c{t}", "s", [output(3, 2, seed=t)], SAMPLE) for t in range(300)))
    # Then all are in, through no more connections than PUTS_IN_FLIGHT (and the keyspace read's)
    pool = client.r.connection_pool
    opened = len(pool._available_connections) + len(pool._in_use_connections)
    await client.aclose()
    assert sync_redis.xlen(Keyspace(ns).stream(0)) == 300
    assert 1 <= opened <= PUTS_IN_FLIGHT + 1, opened
