"""A connection whose handshake fails is opened again by the retry policy (rewardq.queue.handshake).

redis-py retries opening a socket but not the handshake after it, and takes a connection from the
pool before a pipeline's retry begins: a producer's ``put_*`` failed at once when a server was
SIGKILLed right after accepting the socket (reset) or was still loading its data after a restart
(``LOADING``). Through a proxy that spoils the first connections' handshakes, the blocking and the
asyncio clients put, read and pipeline as if nothing happened; a refused password is not sent again.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from rewardq import AsyncRewardClient, RewardClient
from rewardq.errors import PutError, RedisConnectionLost
from rewardq.queue import retry
from rewardq.queue.connection import connect_async, connect_sync
from rewardq.queue.keys import Keyspace
from tests.support.handshake_proxy import HandshakeProxy, Spoil
from tests.support.redis_server import RedisServer, free_port

SAMPLE = {"data_source": "test", "reward_model": {"ground_truth": "1"}}
OUTPUTS = [{"prompt_ids": [1, 2], "response_ids": [3, 4, 5]} for _ in range(3)]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _queued(srv: RedisServer, ns: str) -> int:
    r = srv.client()
    try:
        ks = Keyspace(ns)
        return sum(int(r.xlen(ks.stream(s))) for s in range(ks.shards))
    finally:
        r.close()


@pytest.mark.parametrize("how", ["reset", "loading"])
def test_the_blocking_client_puts_through_spoiled_handshakes(server: RedisServer, how: Spoil) -> None:
    ns = f"hs-{uuid.uuid4().hex[:8]}"
    with HandshakeProxy(("127.0.0.1", server.port), spoiled=3, how=how) as proxy:
        client = RewardClient.from_url(proxy.url(), namespace=ns)
        try:
            keys = client.put_trajectory("u", "s", OUTPUTS, SAMPLE)
        finally:
            client.close()
        assert proxy.accepted >= 4  # three spoiled, then one that went through
    assert keys == ["u_s_0", "u_s_1", "u_s_2"]
    assert _queued(server, ns) == 3


@pytest.mark.parametrize("how", ["reset", "loading"])
def test_the_asyncio_client_puts_through_spoiled_handshakes(server: RedisServer, how: Spoil) -> None:
    ns = f"hs-{uuid.uuid4().hex[:8]}"

    async def put() -> list[str]:
        async with AsyncRewardClient.from_url(proxy.url(), namespace=ns) as client:
            return await client.put_trajectory("u", "s", OUTPUTS, SAMPLE)

    with HandshakeProxy(("127.0.0.1", server.port), spoiled=3, how=how) as proxy:
        keys = asyncio.run(put())
        assert proxy.accepted >= 4
    assert keys == ["u_s_0", "u_s_1", "u_s_2"]
    assert _queued(server, ns) == 3


def test_plain_commands_and_pipelines_ride_through_for_both_clients(server: RedisServer) -> None:
    key = f"hs-{uuid.uuid4().hex[:8]}:k"
    with HandshakeProxy(("127.0.0.1", server.port), spoiled=2, how="reset") as proxy:
        r = connect_sync(proxy.url())
        try:
            assert r.hsetnx(key, "f", "1") == 1
            pipe = r.pipeline(transaction=True)
            pipe.hset(key, "f", "2").hget(key, "f")
            assert pipe.execute() == [0, b"2"]
        finally:
            r.close()

    async def go() -> list[object]:
        a = connect_async(proxy.url())
        try:
            pipe = a.pipeline(transaction=True)
            pipe.hset(key, "f", "3")
            pipe.hget(key, "f")
            return list(await pipe.execute())
        finally:
            await a.aclose()

    with HandshakeProxy(("127.0.0.1", server.port), spoiled=2, how="loading") as proxy:
        assert asyncio.run(go()) == [0, b"3"]


def test_a_refused_password_is_not_sent_again(server: RedisServer) -> None:
    with HandshakeProxy(("127.0.0.1", server.port), spoiled=0, how="wrongpass") as proxy:
        url = f"redis://someone:secret@127.0.0.1:{proxy.port}/0"
        client = RewardClient.from_url(url, namespace="hs-auth")
        try:
            with pytest.raises(PutError, match="refused the credentials"):
                client.put_trajectory("u", "s", OUTPUTS, SAMPLE)
        finally:
            client.close()
        assert proxy.accepted == 1


def test_a_refused_connection_is_tried_by_the_socket_alone_not_once_more_per_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nothing listens: the socket's own tries (RETRIES re-sends) are spent, then the put fails;
    # the handshake layer adds no tries of its own, so the failure comes after one round of backoff
    # (~5-9 s), not at the policy's 20 s deadline
    tries: list[str] = []
    real = retry._Tries.pause

    def counted(self: retry._Tries, error: BaseException, started: float) -> float | None:
        tries.append(type(error).__name__)
        return real(self, error, started)

    monkeypatch.setattr(retry._Tries, "pause", counted)
    client = RewardClient.from_url(f"redis://127.0.0.1:{free_port()}/0", namespace="hs-refused")
    try:
        with pytest.raises(RedisConnectionLost):
            client.put_trajectory("u", "s", OUTPUTS, SAMPLE)
    finally:
        client.close()
    assert len(tries) == retry.RETRIES + 1, tries
