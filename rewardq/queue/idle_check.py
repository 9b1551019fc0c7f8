"""A pooled asyncio connection's check for unread data, answered without waiting a turn of the loop.

Before handing out a connection, redis-py's asyncio pool asks it whether it holds unread data (a
reply nobody read would answer the next command): ``can_read_destructive``, which with hiredis
reads the socket under ``asyncio.timeout(0)``. When nothing was received, which is every checkout
of a healthy connection, that read waits one turn of the event loop and is then cancelled by its
timeout: a future, a timer, a cancellation thrown through the read's coroutines and a
``TimeoutError`` caught, ~7 µs of CPU per checkout (``rewardq.queue.connection``'s pool: 14 → 7
µs per checkout and release, docs/performance.md), paid by every command and pipeline a producer
sends.

:class:`NoWaitIdleCheck` answers from what the event loop has already received instead: when the
connection's stream holds no bytes, has not ended or failed, and hiredis holds no part of a reply,
there is nothing to read, and it says so at once. Anything else (bytes received, the end of the
stream, a parser other than hiredis) goes to redis-py's own check, which then finds the data
without waiting. The one case answered differently is data arriving during the turn redis-py
would have waited: it is read by the next command's reply check like any late byte is (redis-py's
check can miss it the same way: its timeout and the bytes can fall in the same turn).
"""

from __future__ import annotations

from typing import Any

from rewardq.queue.handshake import mix_into
from rewardq.queue.packing import HAVE_HIREDIS

if HAVE_HIREDIS:
    import hiredis


class NoWaitIdleCheck:
    """A mixin for redis-py asyncio connections: ``can_read_destructive`` without waiting a loop turn."""

    _reader: Any  # the connection's asyncio.StreamReader (None when not connected)
    _parser: Any

    async def can_read_destructive(self) -> bool:
        stream = self._reader
        buffered = getattr(self._parser, "_reader", None)  # hiredis's reader: what the parser was fed
        socket_is_empty = getattr(self, "_socket_is_empty", None)  # redis-py's: no bytes in the stream
        if (
            stream is None
            or socket_is_empty is None
            or not isinstance(buffered, hiredis.Reader)
            or buffered.has_data()
            or not socket_is_empty()
            or stream.at_eof()
            or stream.exception() is not None
        ):
            return await super().can_read_destructive()  # type: ignore[misc,no-any-return]  # the redis-py connection this mixes into
        return False


def no_wait_idle_check(pool: Any) -> Any:
    """``pool`` (a redis-py asyncio connection pool) with :class:`NoWaitIdleCheck` connections (with
    hiredis only: without it the pool is left as it is)."""
    return mix_into(pool, NoWaitIdleCheck) if HAVE_HIREDIS else pool
