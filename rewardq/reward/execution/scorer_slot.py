"""One scorer process as its pool sees it, and what became of a task sent to it.

A :class:`ScorerSlot` is one ``multiprocessing`` Process running
:func:`rewardq.reward.execution.scorer_process.child_main`, the parent's end of its duplex Pipe, and
the pool's notes on it (ready, busy since when, with which task). It starts its process,
signals it, and stops it: its descendants (what a hung call forked) SIGKILLed, then the process
SIGTERMed, SIGKILLed after a grace period and reaped with its pipe closed, then what is left of
its process group killed. Which slot gets which task, and when one is replaced or a spare
starts, is :class:`rewardq.reward.execution.process_pool.ScorerPool`'s business.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rewardq.reward.execution.scorer_children import descendants, kill
from rewardq.reward.execution.scorer_process import child_main
from rewardq.reward.execution.settings import SCORER_OUTPUT_CAP, SCORER_REPLY_BYTES


@dataclass
class TaskResult:
    """What became of one task: ``status`` is ``ok``, ``error``, ``timeout`` or ``crash``.

    ``traceback`` is the child's traceback text for an ``error``, ``failure_kind`` and
    ``retry_after`` what the child's exception said of itself
    (:func:`~rewardq.queue.states.failure_kind_of`, ``retry_after``).
    """

    status: str
    value: object = None
    message: str = ""
    pid: int | None = None
    traceback: str = ""
    failure_kind: str | None = None
    retry_after: float | None = None


@dataclass(eq=False)
class PoolCall:
    """One call of a pool's caller, wherever it is: waiting for a process, queued ahead in one, or running.

    ``message`` is the pickled ``(task_id, kwargs)`` sent down a pipe (again, should the call be
    taken back and sent elsewhere); ``started`` is resolved once a process begins the call (or it
    ended without starting), ``done`` with its :class:`TaskResult`; ``timer`` is its timeout,
    armed when it starts.
    """

    task_id: int
    message: bytes
    timeout: float | None
    started: asyncio.Future[None]
    done: asyncio.Future[TaskResult]
    slot: ScorerSlot | None = None
    timer: asyncio.TimerHandle | None = None

    def finish(self, result: TaskResult | BaseException) -> None:
        """Give the caller ``result`` (or raise it there), unless it already has one or gave up."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.started.done():
            self.started.set_result(None)
        if not self.done.done():
            if isinstance(result, BaseException):
                self.done.set_exception(result)
            else:
                self.done.set_result(result)

    def abandon(self) -> None:
        """The caller gave up: nothing is told to it any more."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.started.cancel()
        self.done.cancel()


@dataclass(eq=False)
class Sent:
    """A call a process holds, in the order it runs them: ``call`` None once it was taken back
    (``revoked``): the process drops it unread, or runs it for nobody if it had begun it."""

    task_id: int
    timeout: float | None
    call: PoolCall | None


@dataclass(eq=False)
class ScorerSlot:
    """One scorer process and the parent's end of its pipe.

    ``sent`` holds the calls the process was sent, in its order: the first runs, the others are
    queued ahead in its pipe. ``busy_since`` is when the first began (None: starting or idle), and
    ``threshold``, ``cpu_mark`` and ``stuck_seen`` what
    :class:`~rewardq.reward.execution.spares.SparePolicy` needs to tell whether that task is
    stuck; ``idle_since`` is when the process last became idle; ``own_group`` is whether it
    leads a process group of its own (it says so when ready); ``init_error`` is the child's
    message when it could not load the function.
    """

    index: int
    proc: Any
    conn: Any
    ready: bool = False
    dead: bool = False
    sent: deque[Sent] = field(default_factory=deque)
    init_error: str | None = None
    started: float = field(default_factory=time.monotonic)
    busy_since: float | None = None
    threshold: float | None = None
    cpu_mark: tuple[float, float] | None = None
    stuck_seen: bool = False
    idle_since: float = field(default_factory=time.monotonic)
    own_group: bool = False

    @classmethod
    def start(
        cls,
        ctx: Any,
        index: int,
        target: object,
        kwargs: Mapping[str, object],
        *,
        output_cap: int = SCORER_OUTPUT_CAP,
        reply_cap: int = SCORER_REPLY_BYTES,
    ) -> ScorerSlot:
        """Start a daemonic process ``rewardq-scorer-<index>`` (``ctx``: a multiprocessing
        context) that loads ``target`` with ``kwargs`` and then serves tasks, its output capped
        at ``output_cap`` bytes per stream per task, its replies at ``reply_cap`` bytes. Started
        by a forkserver, it dies with it (and so with the worker, even one that was SIGKILLed)."""
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=child_main,
            args=(child_conn, target, kwargs, output_cap, ctx.get_start_method() == "forkserver", reply_cap),
            name=f"rewardq-scorer-{index}",
            daemon=True,
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

    def kill_descendants(self) -> None:
        """SIGKILL every descendant of the process (what a call forked), if it is still alive."""
        if self.proc.pid is not None and self.proc.is_alive():
            kill(descendants(self.proc.pid))

    async def stop(self, grace: float) -> None:
        """Kill the process's descendants; SIGTERM it, then SIGKILL after ``grace`` seconds; reap
        it and close its pipe; kill what is left of its process group."""
        proc = self.proc
        if proc.is_alive():
            self.kill_descendants()  # what a hung call forked: it cannot clean up after itself
            proc.terminate()
            deadline = time.monotonic() + grace
            while proc.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if proc.is_alive():
                proc.kill()
            while proc.is_alive():
                await asyncio.sleep(0.01)
        proc.join(timeout=0)
        if self.own_group and proc.pid is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its group outlives it while any member does
            except OSError:
                pass
        try:
            self.conn.close()
        except OSError:
            pass
