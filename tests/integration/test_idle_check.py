"""A pooled asyncio connection's check for unread data waits no loop turn, and still finds what
redis-py's check finds (rewardq.queue.idle_check): a reply nobody read, a connection the server
closed. Against a throwaway redis-server (a test here kills its own connections)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from rewardq.queue.connection import connect_async
from rewardq.queue.idle_check import NoWaitIdleCheck
from tests.support.redis_server import RedisServer


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _answer_at_once(coro: Coroutine[Any, Any, bool]) -> bool:
    """The coroutine's result if it finishes without suspending; fails the test if it suspends."""
    try:
        coro.send(None)
    except StopIteration as done:
        return bool(done.value)
    coro.close()
    raise AssertionError("the check suspended: it waited for a turn of the event loop")


async def _until(condition: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_an_idle_connection_is_found_clean_without_waiting(server: RedisServer) -> None:
    async def run() -> None:
        r = connect_async(server.url)
        try:
            await r.ping()
            pool: Any = r.connection_pool  # redis-py types its asyncio pool's methods loosely
            conn = await pool.get_connection()
            assert isinstance(conn, NoWaitIdleCheck)
            assert _answer_at_once(conn.can_read_destructive()) is False
            await pool.release(conn)
            assert await r.echo("after") == b"after"
        finally:
            await r.aclose()

    asyncio.run(run())


def test_a_reply_nobody_read_is_found_and_never_answers_the_next_command(server: RedisServer) -> None:
    async def run() -> None:
        r = connect_async(server.url)
        try:
            pool: Any = r.connection_pool
            conn = await pool.get_connection()
            await conn.send_command("ECHO", "stray")  # sent, its reply never read
            await _until(lambda: not conn._socket_is_empty())
            assert await conn.can_read_destructive() is True
            await pool.release(conn)
            # the pool finds the stray reply and reconnects: the next commands get their own replies
            assert await r.echo("mine") == b"mine"
            assert await r.ping() is True
        finally:
            await r.aclose()

    asyncio.run(run())


def test_a_connection_the_server_closed_is_opened_again(server: RedisServer) -> None:
    async def run() -> None:
        r = connect_async(server.url)
        admin = server.client()
        try:
            pool: Any = r.connection_pool
            conn = await pool.get_connection()
            await conn.send_command("CLIENT", "ID")
            first = int(await conn.read_response())
            await pool.release(conn)
            admin.execute_command("CLIENT", "KILL", "ID", first)
            await _until(lambda: conn._reader is None or conn._reader.at_eof())
            again = await pool.get_connection()  # the same connection, opened again by the pool's check
            try:
                await again.send_command("CLIENT", "ID")
                assert int(await again.read_response()) != first
            finally:
                await pool.release(again)
            assert await r.echo("fine") == b"fine"
        finally:
            admin.close()
            await r.aclose()

    asyncio.run(run())
