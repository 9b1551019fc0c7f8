"""Small asyncio helpers for loops that must survive Redis errors but never a cancellation."""

from __future__ import annotations

import asyncio


def being_cancelled() -> bool:
    """True when the current task has been asked to stop.

    A loop that catches ``Exception`` to ride out Redis faults must check this: a client
    interrupted mid-command may turn the ``CancelledError`` into a connection error, and a
    loop that swallows it can never be stopped (an event loop then hangs at shutdown).
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return bool(cancelling()) if cancelling is not None else False
