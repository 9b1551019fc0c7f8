"""A step run every few seconds for the life of a worker (heartbeat, maintenance).

A failing step is logged and run again at the next tick; a cancellation always ends the
loop, also one that a Redis client call swallowed (:func:`~rewardq.queue.connection.being_cancelled`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from rewardq.queue.connection import being_cancelled

logger = logging.getLogger("rewardq.worker")


async def run_every(
    interval: float,
    step: Callable[[], Awaitable[None]],
    what: str,
    stops: Callable[[BaseException], bool] = lambda exc: False,
) -> None:
    """Run ``step()`` every ``interval`` seconds; log its failures, never swallow a cancellation.
    ``stops``: whether a failure stops the worker, which then says why itself (nothing is logged)."""
    while True:
        await asyncio.sleep(interval)
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if being_cancelled():
                raise asyncio.CancelledError from exc
            if not stops(exc):
                logger.warning("%s failed: %s", what, exc)
        if being_cancelled():  # a client call swallowed our cancellation: honour it anyway
            raise asyncio.CancelledError
