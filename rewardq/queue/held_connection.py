"""A pooled connection checked out before the records of a put are encoded, so the put is written
the moment they are.

Why: redis-py's asyncio pool checks every connection it hands out for stray data with a zero
timeout, which always ends the calling task's step. A producer that encodes its records and
then asks for a connection therefore writes them one loop turn later; when an agent-loop worker
``asyncio.gather``-s a batch of trajectories, every one of them is encoded (~0.4-1 ms of CPU
each: seconds for a batch of 2,048) before the first reaches Redis, and the workers sit idle
meanwhile. Checking the connection out first, then encoding and writing in one step, lets the
first trajectories be scored while the rest are still being encoded.

A cluster client routes each command to its node: there is nothing to hold, and its pipelines
are made as usual.
"""

from __future__ import annotations

import inspect
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import redis.asyncio as aredis

from rewardq.queue.connection import is_cluster_client

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

#: redis-py before 5.3 requires a command name in ``get_connection``; 5.3 deprecates passing one
_NAMED = (
    inspect.signature(aredis.ConnectionPool.get_connection).parameters["command_name"].default
    is inspect.Parameter.empty
)


class HeldConnection:
    """``async with HeldConnection(client) as held:`` then one ``held.pipeline(transaction=...)``.

    The pipeline runs on the held connection and gives it back to the pool when it has run
    (redis-py's pipeline releases the connection it was given after ``execute``); a connection
    no pipeline ran on is given back when the block ends (a pipeline made but never run is reset,
    which gives it back), or by :meth:`release` before, when the block needs connections of its
    own meanwhile (a pool of N connections held by N callers that each wait for one more would
    wait for ever).
    """

    def __init__(self, client: AsyncRedis) -> None:
        self._client = client
        self._pool = None if is_cluster_client(client) else cast(aredis.Redis, client).connection_pool
        self._conn: Any = None
        self._pipe: Any = None  # the pipeline given the connection, until the block ends

    async def __aenter__(self) -> HeldConnection:
        if self._pool is not None:
            self._conn = await (self._pool.get_connection("MULTI") if _NAMED else self._pool.get_connection())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.release()

    def pipeline(self, transaction: bool = True) -> Any:
        """A pipeline of the client, running on the held connection (if any is still held)."""
        pipe = self._client.pipeline(transaction=transaction)
        if self._conn is not None:
            # redis-py's Pipeline.execute uses a connection already set and resets (releases) it after
            cast(aredis.client.Pipeline, pipe).connection, self._conn = self._conn, None
            self._pipe = pipe
        return pipe

    async def release(self) -> None:
        """Give the connection back now, if no pipeline took it; reset a pipeline that took it
        (after ``execute`` that has been done already, and doing it again changes nothing)."""
        conn, self._conn = self._conn, None
        pipe, self._pipe = self._pipe, None
        if conn is not None and self._pool is not None:
            await self._pool.release(conn)
        if pipe is not None:
            await pipe.reset()
