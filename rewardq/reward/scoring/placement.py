"""Where a worker runs a built-in scorer: the ``placement`` mark that ``placement_of`` reads.

* ``"inline"``:  called in the event loop (regex scorers: tens of microseconds; the default);
* ``"process"``: called in a scorer process (CPU-heavy work, or timeouts that use
  ``signal.alarm``, which only works in a process's main thread);
* ``"async"``:   an ``async def`` scorer awaited in the event loop (I/O-bound work).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

PLACEMENTS = ("inline", "process", "async")

F = TypeVar("F", bound=Callable[..., Any])


def place(fn: F, placement: str) -> F:
    """Mark ``fn`` to run at ``placement`` (one of :data:`PLACEMENTS`); returns ``fn``."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    fn.__dict__["placement"] = placement
    return fn


def placement(fn: Callable[..., object]) -> str:
    """The placement ``fn`` was marked with, ``"inline"`` when unmarked."""
    return str(getattr(fn, "placement", "inline"))
