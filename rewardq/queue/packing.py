"""Packing commands into RESP in C (hiredis), as redis-py's blocking client already does.

redis-py 5's blocking client packs commands with ``hiredis.pack_command`` when hiredis is
installed; its asyncio client always packs in Python, re-joining its buffer once per argument
and running every argument through ``Encoder.encode``. A worker's ``commit`` call has ~50
arguments and a ``claim`` ~15: in Python that cost ~26 µs per ``commit`` call against ~5 µs in C
(docs/performance.md). :class:`HiredisPacking` gives an asyncio connection the blocking
client's packer (redis-py's ``HiredisRespSerializer``: the same bytes, the same ``DataError``
for a value it refuses); :func:`fast_packing` applies it to a pool (:func:`~rewardq.queue.handshake.mix_into`).
Without hiredis the pool is left as it is.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from redis.exceptions import DataError

from rewardq.queue.handshake import mix_into

#: Whether hiredis is installed (rewardq depends on ``redis[hiredis]``; without it pools are left alone).
HAVE_HIREDIS = importlib.util.find_spec("hiredis") is not None
if HAVE_HIREDIS:
    import hiredis


class HiredisPacking:
    """A mixin for redis-py connection classes: ``pack_command`` by ``hiredis.pack_command``."""

    def pack_command(self, *args: Any) -> list[bytes]:
        """The RESP bytes of one command (in one chunk), as redis-py's blocking client packs it."""
        first = args[0]
        if isinstance(first, str):  # a command name may hold literal arguments ("CONFIG GET")
            args = tuple(first.encode().split()) + args[1:]
        elif b" " in first:
            args = tuple(first.split()) + args[1:]
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:  # a bool, None or an object: redis-py's error for it
            raise DataError(exc) from None


def fast_packing(pool: Any) -> Any:
    """``pool`` (a redis-py asyncio connection pool) with :class:`HiredisPacking` connections."""
    return mix_into(pool, HiredisPacking) if HAVE_HIREDIS else pool
