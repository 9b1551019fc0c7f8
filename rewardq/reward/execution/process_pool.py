"""A small process pool for scoring functions, with per-task timeouts that kill.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop one hung task (a
cancelled future keeps its worker busy forever) and a worker that dies breaks the whole
pool. Why not threads: CPU-bound scorers hold the GIL, a hung thread can never be stopped,
and math-verify's timeouts use ``signal.alarm``, which only works in a process's main thread.

Design: one ``multiprocessing`` Process and one duplex Pipe per slot
(:class:`~rewardq.reward.execution.scorer_slot.ScorerSlot`). A child loads the scoring function once,
says ``ready``, then loops: receive ``(task_id, kwargs)``, call the function **in its main
thread**, send back ``ok``/``error``. The parent keeps a queue of idle, ready slots and hands
each task to the first free one; it watches every pipe with ``loop.add_reader`` (no thread
per slot), so a reply or the EOF of a dead child wakes the event loop directly.

* A task that exceeds its timeout, or whose caller gives up (cancels): the child is sent
  SIGTERM, then SIGKILL after ``kill_grace`` seconds, and replaced by a fresh process; the
  caller gets ``TaskResult("timeout")`` (or its cancellation). Other tasks, in other slots,
  never notice.
* A child that dies (segfault, ``os._exit``, OOM kill): the caller gets
  ``TaskResult("crash", message=...)`` naming the exit code or signal and its usual cause;
  the slot is replaced.
* An exception in the scoring function is *not* a crash: ``TaskResult("error", message=...,
  traceback=...)`` and the process stays. So is ``sys.exit()`` or ``KeyboardInterrupt``:
  the message names the call (``the reward function called sys.exit(3)``).
* **Spares** (:mod:`~rewardq.reward.execution.spares`): a process stuck on its call no longer
  counts toward the pool's size, and a call waiting behind it gets a spare process (at most
  ``max_spares`` beyond ``num_workers``; one beyond the size exits after ``spare_idle`` idle
  seconds). A process that is killed is only replaced up to ``num_workers``.

A task's timeout counts from when it is handed to an idle process, not from when it was
queued, and while a call waits for a process its trajectory's clock stands still
(:func:`~rewardq.reward.execution.budget.waiting_for_a_place`): a good call's budget counts its own run,
never its wait behind hung ones. A replacement process is only given work once it has loaded
the function, so import time (sympy takes a second) never eats into a task's timeout.

Each process is put back as it was after every call (working directory, environment, signal
handlers), the children a call leaves behind are killed when it ends, and its stdout and stderr
reach the worker's log capped per call (:mod:`rewardq.reward.execution.scorer_process`).

What crosses the pipe is pickled: the target (a spec string such as
``"package.module:fn"`` or ``"path/to/file.py:fn"``, resolved in the child with
:func:`rewardq.reward.execution.loader.load_score_fn`, or a picklable module-level function), the
task's keyword arguments and the result. This pipe is local between a parent and its own
children; pickle is never used on the Redis wire.

With ``spawn`` and ``forkserver`` a child re-imports the parent's main *script* (not a
``python -m`` module), as multiprocessing always does: keep a script's heavy work under
``if __name__ == "__main__":``. Under the ``rewardq`` CLI a child starts in about 0.3 s.

Children are daemonic (they die with the parent's interpreter, and a SIGKILLed parent
closes their pipe, which ends them; on Linux, children of the forkserver also die with it,
which ends with the worker), so a scoring function's own ``multiprocessing`` children are refused; what it forks or
spawns otherwise is killed when its call ends.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

from rewardq import defaults
from rewardq.errors import ConfigError, ScoringError
from rewardq.reward.execution.budget import current_budget, waiting_for_a_place
from rewardq.reward.execution.escapes import REWARD_FUNCTION, describe_exit, exit_hint
from rewardq.reward.execution.scorer_output import describe_cut
from rewardq.reward.execution.scorer_slot import ScorerSlot, TaskResult
from rewardq.reward.execution.spares import SparePolicy

logger = logging.getLogger("rewardq.reward.remote")

START_METHODS = ("forkserver", "spawn")


class ScorerPool:
    """``num_workers`` scorer processes running one target; see the module docstring.

    Args:
        target: a spec string (``module:fn`` or ``file.py:fn``) or a picklable module-level function.
        kwargs: extra keyword arguments bound to the function in the child.
        num_workers: processes kept ready (= tasks in flight at once, spares aside).
        start_method: ``"forkserver"`` (default on Linux) or ``"spawn"``. ``fork`` is refused:
            forking a process that runs an event loop, threads and torch is unsafe.
        kill_grace: seconds between SIGTERM and SIGKILL for a task that timed out.
        start_timeout: seconds to wait for the processes to load the function at start-up.
        spare_after: seconds a call may run before its process may count as stuck and a spare
            start for waiting calls (sooner for a short budget); None: never (the pool stays at
            ``num_workers``).
        max_spares: most spare processes alive at once beyond ``num_workers``.
        spare_idle: seconds a process beyond ``num_workers`` stays idle before it exits.
        output_cap: bytes of each process's stdout, and of its stderr, per call that reach the log.
        policy: the spare rules in full (tests); overrides ``spare_after``, ``max_spares`` and
            ``spare_idle``.
    """

    def __init__(
        self,
        target: str | Callable[..., Any],
        kwargs: dict[str, Any] | None = None,
        *,
        num_workers: int = defaults.REMOTE_NUM_WORKERS,
        start_method: str | None = None,
        kill_grace: float = defaults.KILL_GRACE,
        start_timeout: float = defaults.SCORER_START_TIMEOUT,
        spare_after: float | None = None,
        max_spares: int = 0,
        spare_idle: float = defaults.SCORER_SPARE_IDLE,
        output_cap: int = defaults.SCORER_OUTPUT_CAP,
        policy: SparePolicy | None = None,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"num_workers must be an integer >= 1, got {num_workers!r}")
        if start_method is None:
            start_method = "forkserver" if sys.platform.startswith("linux") else "spawn"
        if start_method not in START_METHODS:
            raise ConfigError(
                f"start_method must be one of {START_METHODS}, got {start_method!r} (fork is unsafe "
                "in a process that runs an event loop, threads and torch)"
            )
        self.target = target
        self.kwargs = dict(kwargs or {})
        self.num_workers = num_workers
        self.start_method = start_method
        self.kill_grace = kill_grace
        self.start_timeout = start_timeout
        self.spares = policy or SparePolicy(after=spare_after, most=max_spares, idle=spare_idle)
        self.output_cap = output_cap
        self.counters = {
            "tasks": 0,
            "timeouts": 0,
            "crashes": 0,
            "errors": 0,
            "replaced": 0,
            "spares": 0,
            "retired": 0,
            "output_cut": 0,
        }
        self._ctx: Any = multiprocessing.get_context(start_method)
        self._slots: list[ScorerSlot] = []
        self._free: asyncio.Queue[ScorerSlot | None] | None = None
        self._ids = itertools.count(1)
        self._names = itertools.count(num_workers)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._broken: str | None = None
        self._started = False
        self._init_failures = 0
        self._waiting = 0
        self._bg: set[asyncio.Task[Any]] = set()
        self._leaving: set[ScorerSlot] = set()  # retired or replaced processes not yet reaped
        self._trim: asyncio.TimerHandle | None = None  # retires processes beyond the size once idle

    @property
    def max_spares(self) -> int:
        return self.spares.most

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        """Start the processes and wait until every one has loaded the function.

        Raises ConfigError when the target cannot be loaded in a child (the message is the
        child's exception), or when the processes are not ready within ``start_timeout``.
        """
        if self._slots:
            return
        self._loop = asyncio.get_running_loop()
        self._free = asyncio.Queue()
        t0 = time.monotonic()
        self._slots = [self._spawn(i) for i in range(self.num_workers)]
        while not all(s.ready for s in self._slots):
            failed = [s for s in self._slots if s.dead]
            if failed or time.monotonic() - t0 > self.start_timeout:
                why = (
                    (failed[0].init_error or describe_exit(failed[0].proc.exitcode))
                    if failed
                    else f"not ready after {self.start_timeout:g}s"
                )
                await self.close()
                raise ConfigError(
                    f"the scoring function {self.target!r} could not be loaded in a scorer process: {why}"
                )
            await asyncio.sleep(0.005)
        self._started = True
        logger.info(
            "scorer pool: %d %s processes ready in %.2fs (pids %s)",
            self.num_workers,
            self.start_method,
            time.monotonic() - t0,
            self.pids,
        )

    @property
    def pids(self) -> list[int | None]:
        return [s.pid for s in self._slots]

    def _spawn(self, index: int) -> ScorerSlot:
        slot = ScorerSlot.start(self._ctx, index, self.target, self.kwargs, output_cap=self.output_cap)
        assert self._loop is not None
        self._loop.add_reader(slot.conn.fileno(), self._on_readable, slot)
        return slot

    async def close(self) -> None:
        """Stop every process within about a second and fail waiting callers.

        Idle processes are asked to exit, busy ones are sent SIGTERM at once (their callers
        are going away too, and what their calls forked is killed first), and whatever is still
        alive a second later is killed.
        """
        self._closed = True
        if self._trim is not None:
            self._trim.cancel()
            self._trim = None
        for task in list(self._bg):
            task.cancel()
        everyone = [*self._slots, *self._leaving]
        for slot in everyone:
            if slot.dead or slot.busy_since is not None:
                slot.kill_descendants()  # what a call in flight forked goes with it
                slot.send_signal(signal.SIGTERM)
                continue
            try:
                slot.conn.send(None)
            except (OSError, ValueError):
                slot.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 1.0
        while any(s.proc.is_alive() for s in everyone) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for slot in everyone:
            self._detach(slot)
            if slot.future is not None and not slot.future.done():
                slot.future.set_result(TaskResult("error", message="the scorer pool was closed"))
            await slot.stop(grace=0.0)
        self._slots = []
        self._leaving.clear()
        if self._free is not None:
            self._free.put_nowait(None)

    # -- events from the children ------------------------------------------------------
    def _on_readable(self, slot: ScorerSlot) -> None:
        try:
            while not slot.dead and slot.conn.poll():
                self._on_message(slot, slot.conn.recv())
        except (EOFError, OSError):
            self._on_dead(slot)

    def _on_message(self, slot: ScorerSlot, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "ready":
            slot.ready = True
            slot.own_group = bool(msg[2]) if len(msg) > 2 else False
            slot.idle_since = time.monotonic()
            self._init_failures = 0
            logger.debug("scorer process %s ready in %.2fs", slot.pid, time.monotonic() - slot.started)
            if self._free is not None and not self._closed:
                self._free.put_nowait(slot)
        elif kind == "output":
            self.counters["output_cut"] += 1
            for stream, written, dropped in msg[2]:
                logger.warning("scorer process %s: %s", slot.pid, describe_cut(stream, written, dropped, msg[1] == 0))
        elif kind == "init_error":
            slot.init_error = msg[1]
            self._on_dead(slot)
        elif slot.future is not None and msg[1] == slot.task_id and not slot.future.done():
            error = kind == "error"
            slot.future.set_result(
                TaskResult(
                    kind,
                    value=msg[2] if kind == "ok" else None,
                    message=msg[2] if error else "",
                    pid=slot.pid,
                    traceback=msg[3] if error and len(msg) > 3 else "",
                    failure_kind=msg[4] if error and len(msg) > 4 else None,
                    retry_after=msg[5] if error and len(msg) > 5 else None,
                )
            )

    def _on_dead(self, slot: ScorerSlot) -> None:
        if slot.dead:
            return
        slot.dead = True
        self._detach(slot)
        if slot.future is not None and not slot.future.done():
            slot.future.set_result(TaskResult("crash", pid=slot.pid))
        elif not self._closed and slot.ready and slot in self._slots:  # died while idle
            self._background(self._replace(slot, "died while idle"))
        elif not self._closed and self._started and slot in self._slots:  # a replacement failed to load
            why = slot.init_error or describe_exit(slot.proc.exitcode)
            self._init_failures += 1
            if self._init_failures <= 3:
                logger.warning("a replacement scorer process could not load %r (%s); retrying", self.target, why)
                self._background(self._replace(slot, "failed to load", delay=float(self._init_failures)))
            else:
                self._broken = f"replacement processes keep failing to load {self.target!r}: {why}"
                logger.error("scorer pool broken: %s", self._broken)
                assert self._free is not None
                self._free.put_nowait(None)

    def _detach(self, slot: ScorerSlot) -> None:
        if self._loop is not None:
            try:
                self._loop.remove_reader(slot.conn.fileno())
            except (OSError, ValueError):
                pass

    def _background(self, coro: Awaitable[object]) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # -- running tasks -------------------------------------------------------------------
    async def _idle_slot(self) -> ScorerSlot:
        """An idle, ready process; while the call waits for one (or for the pool to start), its
        trajectory's clock stands still."""
        if not self._slots and not self._closed:
            with waiting_for_a_place():
                await self.start()
        assert self._free is not None
        while True:
            if self._closed or self._broken:
                raise ScoringError(
                    f"the scorer pool is {'closed' if self._closed else 'broken'}"
                    f"{': ' + self._broken if self._broken else ''}"
                )
            try:
                slot = self._free.get_nowait()  # the usual case: no task, no timer
            except asyncio.QueueEmpty:
                self._start_spare_if_stuck()
                try:
                    with waiting_for_a_place():
                        slot = await asyncio.wait_for(self._free.get(), self._spare_check_in())
                except asyncio.TimeoutError:
                    continue
            if slot is None:
                self._free.put_nowait(None)  # wake the next waiter too
                continue
            if not slot.dead and slot in self._slots:
                return slot

    def _able(self, now: float) -> int:
        return self.spares.able(self._slots, now)

    def _spare_check_in(self) -> float | None:
        return self.spares.check_in(self._slots, time.monotonic())

    def _start_spare_if_stuck(self) -> None:
        """Start a spare for a waiting call when one is due (see :mod:`rewardq.reward.execution.spares`)."""
        if self._closed or self._broken or self._loop is None:
            return
        now = time.monotonic()
        if not self.spares.spare_due(self._slots, self._waiting, self.num_workers, now):
            return
        stuck = [s for s in self._slots if not s.dead and self.spares.slot_stuck(s, now)]
        alive = sum(1 for s in self._slots if not s.dead)
        slot = self._spawn(next(self._names))
        self._slots.append(slot)
        self.counters["spares"] += 1
        logger.warning(
            "%d scorer process(es) stuck on their calls (pids %s); starting spare process %s for the %d call(s) "
            "waiting (%d of at most %d spares alive)",
            len(stuck),
            ",".join(str(s.pid) for s in stuck),
            slot.pid,
            self._waiting,
            alive + 1 - self.num_workers,
            self.spares.most,
        )

    async def run(self, call_kwargs: dict[str, Any], timeout: float | None = None) -> TaskResult:
        """Run the function with ``call_kwargs`` in an idle process, within ``timeout`` seconds.

        ``timeout`` None: the current trajectory's budget (:func:`~rewardq.reward.execution.budget.current_budget`),
        if any, else no limit of its own; a caller that gives up (cancels) still gets its process
        killed and replaced. The timeout counts from when a process takes the call; while the
        call waits for one, its trajectory's clock stands still.
        """
        task_id = next(self._ids)
        try:
            message = bytes(ForkingPickler.dumps((task_id, call_kwargs)))
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable value in extra_info
            raise ScoringError(f"cannot send the sample to a scorer process: {type(exc).__name__}: {exc}") from None
        if timeout is None:
            budget = current_budget()
            timeout = budget.seconds if budget is not None else None
        self._waiting += 1
        try:
            slot = await self._idle_slot()
        finally:
            self._waiting -= 1
        assert self._loop is not None
        self.counters["tasks"] += 1
        slot.task_id = task_id
        slot.future = fut = self._loop.create_future()
        slot.busy_since = time.monotonic()
        slot.threshold = self.spares.threshold(timeout)
        slot.cpu_mark, slot.stuck_seen = None, False
        try:
            slot.conn.send_bytes(message)
        except (OSError, ValueError):
            self._on_dead(slot)
        try:
            result: TaskResult = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            self.counters["timeouts"] += 1
            logger.warning("scorer process %s exceeded its %.1fs timeout; killing and replacing it", slot.pid, timeout)
            await self._replace(slot, "timeout")
            return TaskResult("timeout", pid=slot.pid, message=f"{timeout:g}s")
        except asyncio.CancelledError:  # the caller gave up: the process is busy with it, so replace it
            self._background(self._replace(slot, "its caller gave up (timeout or shutdown)"))
            raise
        if result.status == "crash":
            self.counters["crashes"] += 1
            await slot.stop(self.kill_grace)
            code = slot.proc.exitcode
            hint = exit_hint(code)
            result.message = f"{REWARD_FUNCTION}'s process (pid {slot.pid}) {describe_exit(code)} while scoring" + (
                f" ({hint})" if hint else ""
            )
            logger.error("%s; replacing it", result.message)
            await self._replace(slot, "crash")
            return result
        if result.status == "error":
            self.counters["errors"] += 1
        self._release(slot)
        return result

    def _release(self, slot: ScorerSlot) -> None:
        """A slot finished its task: back to the idle queue. When more than ``num_workers``
        processes can take work, the surplus exits once idle for ``spare_idle`` seconds."""
        now = time.monotonic()
        slot.future = None
        slot.task_id = None
        slot.busy_since = None
        slot.threshold, slot.cpu_mark, slot.stuck_seen = None, None, False
        slot.idle_since = now
        if self._closed:
            return
        assert self._free is not None and self._loop is not None
        self._free.put_nowait(slot)
        if self._trim is None and self._able(now) > self.num_workers:
            self._trim = self._loop.call_later(self.spares.idle, self._trim_surplus)

    def _trim_surplus(self) -> None:
        """Retire the processes beyond ``num_workers`` that have been idle for ``spare_idle`` seconds."""
        self._trim = None
        if self._closed or self._loop is None:
            return
        now = time.monotonic()
        for slot in self.spares.to_retire(self._slots, self._waiting, self.num_workers, now):
            self._slots.remove(slot)  # its place in the idle queue is skipped from now on
            self.counters["retired"] += 1
            self._background(self._retire(slot))
        later = self.spares.next_trim(self._slots, self.num_workers, now)
        if later is not None:
            self._trim = self._loop.call_later(later, self._trim_surplus)

    async def _retire(self, slot: ScorerSlot) -> None:
        """Let a surplus process exit on its own (``None``), killing it if it does not."""
        self._leaving.add(slot)
        self._detach(slot)
        try:
            slot.conn.send(None)
        except (OSError, ValueError):
            pass
        deadline = time.monotonic() + self.kill_grace
        while slot.proc.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        slot.dead = True
        await slot.stop(self.kill_grace)
        self._leaving.discard(slot)
        logger.debug("spare scorer process %s retired", slot.pid)

    async def _replace(self, slot: ScorerSlot, reason: str, delay: float = 0.0) -> None:
        """Kill ``slot``'s process and start another while fewer than ``num_workers`` can take work."""
        slot.dead = True
        self._detach(slot)
        if slot.future is not None and not slot.future.done():
            slot.future.cancel()
        if slot not in self._slots:
            await slot.stop(self.kill_grace)
            return
        self._slots.remove(slot)
        self._leaving.add(slot)
        await slot.stop(self.kill_grace)
        self._leaving.discard(slot)
        if delay:
            await asyncio.sleep(delay)
        # processes stuck on calls of their own do not count: they are about to go too
        if self._closed or self._able(time.monotonic()) >= self.num_workers:
            logger.info("scorer process %s stopped (%s); the pool is at its size without it", slot.pid, reason)
            return
        new = self._spawn(slot.index)
        self._slots.append(new)
        self.counters["replaced"] += 1
        logger.info("scorer process %s replaced by %s (%s)", slot.pid, new.pid, reason)
