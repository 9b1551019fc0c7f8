"""Threads for the sync scoring functions that cannot go to a scorer process.

A function a scorer process cannot load by name (a lambda, a closure, a callable object
built in the worker's own process) runs here, in threads of the worker. Python cannot stop a
thread, so this runner does the next best thing:

* at most ``size`` calls run at once (one that waits for a place does not spend its
  trajectory's budget meanwhile: :mod:`rewardq.reward.execution.budget`);
* a call whose caller gives up (the trajectory's timeout, a shutdown) frees its place at
  once and leaves its thread running, *lost*, so later calls are never starved by hung ones;
* at most ``max_lost`` threads may be lost at a time; past that, calls fail at once with a
  message saying how to isolate the function, instead of piling up threads without end;
* every thread is a daemon, so a hung one never keeps the worker's process alive after it
  stopped (``concurrent.futures`` threads are joined at interpreter exit, and asyncio's
  default executor is waited for when the loop closes: a hung call there blocks exit forever).

What a thread cannot protect against: ``os._exit`` or a segfault ends the whole worker, and
a call that holds the GIL stalls the worker's event loop while it runs. Scorer processes
(:mod:`rewardq.reward.execution.process_pool`) have neither problem.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from typing import Any

from rewardq.errors import ScoringError
from rewardq.reward.execution.budget import waiting_for_a_place
from rewardq.reward.execution.escapes import REWARD_FUNCTION, describe_escape


class ThreadRunner:
    """Run ``fn`` in daemon threads (see the module docstring).

    Args:
        fn: a synchronous function, called with keyword arguments.
        size: calls running at once.
        max_lost: abandoned calls whose threads may still be running before new calls are refused.
    """

    def __init__(self, fn: Callable[..., object], *, size: int, max_lost: int) -> None:
        self.fn = fn
        self.size = max(1, int(size))
        self.max_lost = max(1, int(max_lost))
        self.lost = 0
        self.counters = {"calls": 0, "lost": 0}
        self._slots = asyncio.Semaphore(self.size)
        self._lock = threading.Lock()
        self._names = itertools.count(1)

    async def call(self, kwargs: dict[str, Any]) -> object:
        """``fn(**kwargs)`` in a thread; its exception is raised here (``SystemExit`` and
        ``KeyboardInterrupt`` as a :class:`ScoringError` naming them)."""
        if self.lost >= self.max_lost:
            raise ScoringError(
                f"{self.lost} earlier calls of {REWARD_FUNCTION} {self.fn!r} never returned and their threads "
                "cannot be stopped; no more calls are started. Make the function importable by name (a module-level "
                "function, or --reward-fn FILE.py:FUNC) so it runs in scorer processes, which are killed on "
                "timeout, or restart the worker"
            )
        if self._slots.locked():  # every place taken: the trajectory's clock stops while it waits
            with waiting_for_a_place():
                await self._slots.acquire()
        else:
            await self._slots.acquire()
        try:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[Any] = loop.create_future()
            state = {"finished": False, "abandoned": False}  # guarded by self._lock

            def deliver(outcome: tuple[bool, object]) -> None:
                if not done.done():
                    done.set_result(outcome)

            def work() -> None:
                try:
                    outcome: tuple[bool, Any] = (True, self.fn(**kwargs))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
                    outcome = (False, exc)
                with self._lock:
                    state["finished"] = True
                    if state["abandoned"]:
                        self.lost -= 1
                        return
                try:
                    loop.call_soon_threadsafe(deliver, outcome)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    pass

            thread = threading.Thread(target=work, name=f"rewardq-score-{next(self._names)}", daemon=True)
            self.counters["calls"] += 1
            thread.start()
            try:
                ok, value = await done
            except asyncio.CancelledError:
                with self._lock:
                    if not state["finished"]:
                        state["abandoned"] = True
                        self.lost += 1
                        self.counters["lost"] += 1
                raise
        finally:
            self._slots.release()
        if ok:
            return value
        why = describe_escape(value, REWARD_FUNCTION)
        if why is not None:
            raise ScoringError(why) from None
        raise value
