"""One scorer process as its pool sees it, and what became of a task sent to it.

A :class:`ScorerSlot` is one ``multiprocessing`` Process running
:func:`rewardq.reward.execution.scorer_process.child_main`, the parent's end of its duplex Pipe, and
the pool's notes on it (ready, busy since when, with which task). It starts its process,
signals it, and stops it: SIGTERM, then SIGKILL after a grace period, then reaped with its
pipe closed. Which slot gets which task, and when one is replaced or a spare starts, is
:class:`rewardq.reward.execution.process_pool.ScorerPool`'s business.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

from rewardq.reward.execution.scorer_process import child_main


@dataclass
class TaskResult:
    """What became of one task: ``status`` is ``ok``, ``error``, ``timeout`` or ``crash``.

    ``traceback`` is the child's traceback text for an ``error``.
    """

    status: str
    value: object = None
    message: str = ""
    pid: int | None = None
    traceback: str = ""


@dataclass(eq=False)
class ScorerSlot:
    """One scorer process and the parent's end of its pipe.

    ``busy_since`` is when the current task was handed over (None: starting or idle);
    ``init_error`` is the child's message when it could not load the function.
    """

    index: int
    proc: Any
    conn: Any
    ready: bool = False
    dead: bool = False
    task_id: int | None = None
    future: asyncio.Future[Any] | None = None
    init_error: str | None = None
    started: float = field(default_factory=time.monotonic)
    busy_since: float | None = None

    @classmethod
    def start(cls, ctx: Any, index: int, target: object, kwargs: dict[str, Any]) -> ScorerSlot:
        """Start a daemonic process ``rewardq-scorer-<index>`` (``ctx``: a multiprocessing
        context) that loads ``target`` with ``kwargs`` and then serves tasks."""
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=child_main, args=(child_conn, target, kwargs), name=f"rewardq-scorer-{index}", daemon=True
        )
        proc.start()
        child_conn.close()
        return cls(index=index, proc=proc, conn=parent_conn)

    @property
    def pid(self) -> int | None:
        pid: int | None = self.proc.pid
        return pid

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process if it is still alive."""
        if self.proc.pid is not None and self.proc.is_alive():
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    async def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; reap the process and close its pipe."""
        proc = self.proc
        if proc.is_alive():
            proc.terminate()
            deadline = time.monotonic() + grace
            while proc.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if proc.is_alive():
                proc.kill()
            while proc.is_alive():
                await asyncio.sleep(0.01)
        proc.join(timeout=0)
        try:
            self.conn.close()
        except OSError:
            pass
