"""Backpressure: a producer waits while a shard's stream holds ``max_backlog`` unprocessed
entries (it learns each length for free from the XADD's reply), for at most its timeout."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from rewardq.errors import BackpressureTimeout


class Backlog:
    """Per-shard backlog gate: after each XADD we learn the stream length for free."""

    def __init__(self, max_backlog: int | None, timeout: float) -> None:
        self.max_backlog = max_backlog
        self.timeout = timeout
        self.full: set[int] = set()

    def note(self, shard: int, length: int) -> None:
        if self.max_backlog is not None and length >= self.max_backlog:
            self.full.add(shard)
        else:
            self.full.discard(shard)

    def note_all(self, shards: Sequence[int], lengths: Iterable[Any]) -> None:
        for shard, length in zip(shards, lengths):
            self.note(shard, int(length))

    def waiting(self, shard: int) -> BacklogWait:
        """Start waiting for a full ``shard`` to drain (see :class:`BacklogWait`)."""
        return BacklogWait(self, shard)

    def error(self, shard: int, length: int) -> BackpressureTimeout:
        return BackpressureTimeout(
            f"shard {shard} still holds {length} unprocessed entries (max_backlog={self.max_backlog}) after "
            f"waiting {self.timeout:g}s; start more workers (`rewardq worker`), check them with "
            "`rewardq status`, or raise max_backlog"
        )


class BacklogWait:
    """One wait for a full shard to drain: the caller polls XLEN and sleeps as :meth:`after` says,
    0.01 s doubling up to 0.5 s, for at most the backlog's timeout."""

    def __init__(self, backlog: Backlog, shard: int) -> None:
        self.backlog = backlog
        self.shard = shard
        self.deadline = time.monotonic() + backlog.timeout
        self.delay = 0.01

    def after(self, length: int) -> float | None:
        """Note the shard's ``length``: None once it has room, else the seconds to sleep before the
        next poll. Raises BackpressureTimeout once the wait has lasted the timeout."""
        self.backlog.note(self.shard, length)
        if self.shard not in self.backlog.full:
            return None
        if time.monotonic() >= self.deadline:
            raise self.backlog.error(self.shard, length)
        delay, self.delay = self.delay, min(self.delay * 2, 0.5)
        return delay
