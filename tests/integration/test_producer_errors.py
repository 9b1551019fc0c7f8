"""A producer's ``put_*`` failing in Redis raises rewardq's error: short, actionable, all or nothing.

On a throwaway ``redis-server`` with a small ``maxmemory`` (out of memory), paused writes (a
stalled server) and a closed port (no server), with the blocking and the asyncio client. After a
refused ``put_trajectory`` nothing of it is queued; after the cause is gone the same call succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from rewardq import AsyncRewardClient, RewardClient
from rewardq.errors import (
    PutError,
    RecordError,
    RedisConnectionLost,
    RedisOutOfMemory,
    RedisTimeout,
    RedisUnavailable,
    RewardqError,
    TrajectoryTooLarge,
)
from rewardq.queue.clients import blocking
from rewardq.queue.keys import Keyspace
from tests.support.redis_server import RedisServer, free_port
from tests.support.sync_client import SyncClient

SAMPLE = {"data_source": "test", "reward_model": {"ground_truth": "1"}}
#: A marker inside every record, to prove no message carries record bytes.
MARK = 987_654_321


def _outputs(n: int, tokens: int) -> list[dict[str, Any]]:
    return [{"prompt_ids": np.full(tokens, MARK, dtype=np.int32), "response_ids": [1, 2, 3]} for _ in range(n)]


def _fill(r: SyncClient) -> None:
    """Write filler until Redis refuses a write for memory."""
    block = b"f" * (1024 * 1024)
    for i in range(10_000):
        try:
            r.set(f"filler:{i}", block)
        except redis.exceptions.OutOfMemoryError:
            return
    raise AssertionError("Redis never ran out of memory")


def _check_short(err: BaseException) -> str:
    text = str(err)
    assert isinstance(err, RewardqError) and isinstance(err, PutError)
    assert len(text) < 1000, len(text)
    assert MARK.to_bytes(4, "little").decode("latin-1") not in text and "\\x" not in text
    assert "XADD" not in text.upper() and "Command #" not in text and "pipeline" not in text  # no command quoted
    assert err.__cause__ is None and err.__suppress_context__
    return text


@contextlib.contextmanager
def oom_server() -> Iterator[tuple[RedisServer, SyncClient]]:
    with RedisServer(extra=["--maxmemory", "40mb", "--maxmemory-policy", "noeviction"]) as srv:
        r = srv.client()
        try:
            yield srv, r
        finally:
            r.close()


def test_an_out_of_memory_redis_refuses_puts_with_a_short_rewardq_error_and_keeps_nothing() -> None:
    with oom_server() as (srv, r):
        ns = "oom"
        ks = Keyspace(ns)
        client = RewardClient.from_url(srv.url, namespace=ns)
        client.put_output("early", "s", 0, _outputs(1, 1000)[0], SAMPLE)  # an earlier put of a trajectory
        _fill(r)
        before = r.xlen(ks.stream(0))
        # When the producer puts a whole trajectory, and one more output of the earlier one
        with pytest.raises(RedisOutOfMemory) as traj:
            client.put_trajectory("big", "s", _outputs(5, 250_000), SAMPLE)
        with pytest.raises(RedisOutOfMemory) as one:
            client.put_output("early", "s", 1, _outputs(1, 250_000)[0], SAMPLE, final=True)
        # Then each error is rewardq's, short, without record bytes, and says what to do
        for err in (traj.value, one.value):
            text = _check_short(err)
            assert "out of memory" in text and "maxmemory" in text and "drain the backlog" in text
            assert "nothing of it was written" in text and err.written is False
        assert "put_trajectory of 5 outputs of big_s (5.0 MB)" in str(traj.value)
        assert traj.value.keys == [f"big_s_{i}" for i in range(5)] and one.value.keys == ["early_s_1"]
        # And nothing of the refused calls was queued; the earlier put still is
        assert r.xlen(ks.stream(0)) == before == 1
        # When memory is freed, the same calls succeed
        r.flushdb()
        client._ks = None
        assert client.put_trajectory("big", "s", _outputs(5, 1000), SAMPLE) == [f"big_s_{i}" for i in range(5)]
        client.close()


async def test_the_async_client_raises_the_same_errors() -> None:
    with oom_server() as (srv, r):
        client = AsyncRewardClient.from_url(srv.url, namespace="aoom")
        await client.keyspace()
        _fill(r)
        with pytest.raises(RedisOutOfMemory) as traj:
            await client.put_trajectory("big", "s", _outputs(3, 250_000), SAMPLE)
        with pytest.raises(RedisOutOfMemory) as one:
            await client.put_output("x", "s", 0, _outputs(1, 250_000)[0], SAMPLE)
        for err in (traj.value, one.value):
            assert "maxmemory" in _check_short(err)
        assert traj.value.keys == [f"big_s_{i}" for i in range(3)] and one.value.keys == ["x_s_0"]
        assert r.xlen(Keyspace("aoom").stream(0)) == 0
        await client.aclose()
        # And a fresh client, on this namespace or a new one, names the keys of its refused call too
        for ns in ("aoom", "anew"):
            fresh = AsyncRewardClient.from_url(srv.url, namespace=ns)
            with pytest.raises(RedisOutOfMemory) as first:
                await fresh.put_trajectory("y", "s", _outputs(2, 250_000), SAMPLE)
            assert first.value.keys == ["y_s_0", "y_s_1"], (ns, first.value)
            _check_short(first.value)
            await fresh.aclose()


def test_a_stalled_redis_is_a_timeout_that_says_a_retry_is_safe() -> None:
    with RedisServer() as srv:
        admin = srv.client()
        raw = redis.Redis.from_url(srv.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        client = RewardClient(blocking(raw), namespace="st")
        _ = client.keyspace
        pause = threading.Thread(target=admin.execute_command, args=("CLIENT", "PAUSE", "3000", "WRITE"))
        pause.start()
        time.sleep(0.2)
        try:
            with pytest.raises(RedisTimeout) as err:
                client.put_trajectory("u", "s", _outputs(2, 100), SAMPLE)
        finally:
            pause.join()
            admin.execute_command("CLIENT", "UNPAUSE")
        text = _check_short(err.value)
        assert isinstance(err.value, TimeoutError) and isinstance(err.value, RedisUnavailable)
        assert "did not answer" in text and "putting the same outputs again is safe" in text
        assert err.value.written is None
        client.close()
        admin.close()


def test_no_redis_is_a_connection_error_for_both_clients() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    client = RewardClient(blocking(redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0))), namespace="nc")
    with pytest.raises(RedisConnectionLost) as err:
        client.put_output("u", "s", 0, _outputs(1, 10)[0], SAMPLE)
    text = _check_short(err.value)
    assert isinstance(err.value, ConnectionError) and err.value.exit_code == 3
    assert "could not reach Redis" in text and "put_output" in text

    async def put() -> None:
        aclient = AsyncRewardClient(aredis.Redis.from_url(url, retry=AsyncRetry(NoBackoff(), 0)), namespace="nc")
        try:
            await aclient.put_trajectory("u", "s", _outputs(2, 10), SAMPLE)
        finally:
            await aclient.aclose()

    with pytest.raises(RedisConnectionLost):
        asyncio.run(put())


def test_a_trajectory_over_max_trajectory_bytes_is_refused_before_anything_is_written() -> None:
    # 40 legal outputs of 31 MB each: 1.24 GB in one put_trajectory
    with RedisServer(extra=["--maxmemory", "2gb", "--maxmemory-policy", "noeviction"]) as srv:
        r = srv.client()
        client = RewardClient.from_url(srv.url, namespace="tl")
        before = int(r.info("memory")["used_memory"])
        out = {"prompt_ids": np.arange(1, 31 * 1024 * 1024 // 4 - 200, dtype=np.int32), "response_ids": [1]}
        with pytest.raises(TrajectoryTooLarge) as err:
            client.put_trajectory("huge", "s", [out] * 40, SAMPLE)
        assert isinstance(err.value, RecordError) and err.value.field == "outputs"
        assert "max_trajectory_bytes=268,435,456" in str(err.value) and len(str(err.value)) < 1000
        assert r.xlen(Keyspace("tl").stream(0)) == 0 and not r.exists(Keyspace("tl").stream(0))
        assert int(r.info("memory")["used_memory"]) < before + 10**6
        client.close()
        r.close()
