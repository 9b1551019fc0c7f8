"""The trajectories a worker holds, bounded by ``concurrency``.

A trajectory is held from the moment this worker takes its lease until it is committed or
failed (or, at shutdown, handed back), and the heartbeat renews the lease of every held
trajectory (:meth:`InFlightTable.held`). :class:`InFlightTable` is the worker's admission
control: ``capacity`` is set while fewer than ``concurrency`` trajectories are held (the
readers and the reclaimer wait for it before taking more), and ``slots`` lets at most
``concurrency`` of them score at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class InFlight:
    """One held trajectory and the task that scores it."""

    shard: int
    tid: str
    started: float
    task: asyncio.Task[Any] | None = None


class InFlightTable:
    """The held trajectories by id (:attr:`by_tid`), with ``capacity`` and ``slots`` (see the module doc)."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.by_tid: dict[str, InFlight] = {}
        self.capacity = asyncio.Event()  # set while fewer than `concurrency` trajectories are held
        self.capacity.set()
        self.slots = asyncio.Semaphore(concurrency)  # at most `concurrency` scored at once

    def hold(self, shard: int, tid: str) -> InFlight | None:
        """Hold ``tid``; None when it is held already (our own redelivery while we score it:
        the commit will ack it)."""
        if tid in self.by_tid:
            return None
        flight = self.by_tid[tid] = InFlight(shard, tid, time.time())
        if len(self.by_tid) >= self.concurrency:
            self.capacity.clear()
        return flight

    def finished(self, tid: str, *, handed_back: bool = False) -> None:
        """``tid`` is no longer scored; a trajectory handed back stays held until it is released."""
        if not handed_back:
            self.by_tid.pop(tid, None)
        if len(self.by_tid) < self.concurrency:
            self.capacity.set()

    def held(self) -> dict[int, list[str]]:
        """The held trajectories as ``{shard: [tid, ...]}`` (what the broker renews and releases)."""
        held: dict[int, list[str]] = {}
        for f in self.by_tid.values():
            held.setdefault(f.shard, []).append(f.tid)
        return held

    async def settle(self, grace: float) -> None:
        """Let the scoring tasks finish within ``grace`` seconds; cancel the ones still running."""
        pending = [f.task for f in self.by_tid.values() if f.task is not None]
        if pending:
            _, not_done = await asyncio.wait(pending, timeout=grace)
            for t in not_done:
                t.cancel()
            await asyncio.gather(*not_done, return_exceptions=True)
