"""Commands packed in C (rewardq.queue.packing) are byte for byte what redis-py's asyncio packer makes."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio as aredis
from redis.exceptions import DataError

from rewardq.queue.connection import connect_async
from rewardq.queue.packing import HiredisPacking, fast_packing


def _connections() -> tuple[Any, Any]:
    pool = aredis.BlockingConnectionPool.from_url("redis://127.0.0.1:6379/0")
    plain = pool.connection_class(**pool.connection_kwargs)
    fast_packing(pool)
    return plain, pool.connection_class(**pool.connection_kwargs)


def _arg(rnd: random.Random) -> Any:
    kind = rnd.randrange(7)
    if kind == 0:
        return rnd.randrange(-(10**12), 10**12)
    if kind == 1:
        return rnd.random() * 10 ** rnd.randrange(-5, 20)
    if kind == 2:
        return rnd.randbytes(rnd.choice([0, 1, 900, 5999, 6000, 6001, 20000]))
    if kind == 3:
        return "é\x00\n_" * rnd.randrange(0, 2000)
    if kind == 4:
        return memoryview(rnd.randbytes(rnd.randrange(0, 8000)))
    if kind == 5:
        return "x" * rnd.choice([0, 5, 6000, 7000])
    return rnd.choice(["a", b"b", 0, -1, 1.5, float("inf")])


def _wire(chunks: Sequence[bytes | memoryview]) -> bytes:
    return b"".join(bytes(c) for c in chunks)


def test_same_bytes_as_redis_py_for_every_kind_of_argument() -> None:
    plain, fast = _connections()
    assert issubclass(type(fast), HiredisPacking) and not issubclass(type(plain), HiredisPacking)
    rnd = random.Random(7)
    for _ in range(500):
        name = rnd.choice(["EVALSHA", b"EVALSHA", "CONFIG GET", b"XADD", "OBJECT ENCODING"])
        args = [name, *(_arg(rnd) for _ in range(rnd.randrange(0, 60)))]
        assert _wire(fast.pack_command(*args)) == _wire(plain.pack_command(*args))
        commands = [["HSET", *(_arg(rnd) for _ in range(rnd.randrange(0, 20)))] for _ in range(rnd.randrange(1, 6))]
        assert _wire(fast.pack_commands(commands)) == _wire(plain.pack_commands(commands))


@pytest.mark.parametrize("bad", [True, None, object(), [1]])
def test_a_value_redis_py_refuses_is_refused_alike(bad: Any) -> None:
    plain, fast = _connections()
    for conn in (plain, fast):
        with pytest.raises(DataError):
            conn.pack_command("SET", "k", bad)


def test_the_async_client_packs_in_c_and_the_class_is_made_once() -> None:
    one, two = connect_async("redis://127.0.0.1:6379/0"), connect_async("unix:///tmp/nowhere.sock")
    first = one.connection_pool.connection_class
    assert issubclass(first, HiredisPacking) and issubclass(two.connection_pool.connection_class, HiredisPacking)
    assert issubclass(two.connection_pool.connection_class, aredis.UnixDomainSocketConnection)
    assert connect_async("redis://127.0.0.1:6379/1").connection_pool.connection_class is first
    assert fast_packing(one.connection_pool).connection_class is first  # applied twice: unchanged
