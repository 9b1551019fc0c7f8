"""A small process pool for scoring functions, with per-task timeouts that kill.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop one hung task (a
cancelled future keeps its worker busy forever) and a worker that dies breaks the whole
pool. Why not threads: CPU-bound scorers hold the GIL, and math-verify's timeouts use
``signal.alarm``, which only works in a process's main thread.

Design: one ``multiprocessing`` Process and one duplex Pipe per slot. A child loads the
scoring function once, says ``ready``, then loops: receive ``(task_id, kwargs)``, call the
function **in its main thread**, send back ``ok``/``error``. The parent keeps a queue of
idle, ready slots and hands each task to the first free one; it watches every pipe with
``loop.add_reader`` (no thread per slot), so a reply or the EOF of a dead child wakes the
event loop directly.

* A task that exceeds its timeout: the child is sent SIGTERM, then SIGKILL after
  ``kill_grace`` seconds, and replaced by a fresh process; the caller gets
  ``TaskResult("timeout")``. Other tasks, in other slots, never notice.
* A child that dies (segfault, ``os._exit``, OOM kill): the caller gets
  ``TaskResult("crash", message=...)`` naming the exit code or signal; the slot is replaced.
* An exception in the scoring function is *not* a crash: ``TaskResult("error", message=...)``
  and the process stays.

A task's timeout counts from when it is handed to an idle process, not from when it was
queued. A replacement process is only given work once it has loaded the function, so
import time (sympy takes a second) never eats into a task's timeout.

What crosses the pipe is pickled: the target (a spec string such as
``"package.module:fn"`` or ``"path/to/file.py:fn"``, resolved in the child with
:func:`rewardq.reward.loader.load_score_fn`, or a picklable module-level function), the
task's keyword arguments and the result. This pipe is local between a parent and its own
children; pickle is never used on the Redis wire.

With ``spawn`` and ``forkserver`` a child re-imports the parent's main *script* (not a
``python -m`` module), as multiprocessing always does: keep a script's heavy work under
``if __name__ == "__main__":``. Under the ``rewardq`` CLI a child starts in about 0.3 s.

Children are daemonic (they die with the parent's interpreter, and a SIGKILLed parent
closes their pipe, which ends them), so a scoring function cannot itself start processes.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any

from rewardq.errors import ConfigError, ScoringError

logger = logging.getLogger("rewardq.reward.remote")

START_METHODS = ("forkserver", "spawn")


@dataclass
class TaskResult:
    """What became of one task: ``status`` is ``ok``, ``error``, ``timeout`` or ``crash``."""

    status: str
    value: Any = None
    message: str = ""
    pid: int | None = None


def resolve_target(target: str | Callable[..., Any], kwargs: dict | None = None) -> Callable[..., Any]:
    """The callable a spec names (with ``kwargs`` bound), or ``target`` itself with ``kwargs`` bound."""
    if callable(target):
        fn = target
    else:
        try:
            from rewardq.reward.loader import load_score_fn
        except ImportError:  # pragma: no cover - the loader ships with rewardq
            from rewardq.reward.registry import import_object

            fn = import_object(target if ":" in target else f"{target}:compute_score")
        else:
            return load_score_fn(target, dict(kwargs or {}))
    if kwargs:
        import functools

        fn = functools.partial(fn, **kwargs)
    return fn


def _child_main(conn: Any, target: Any, kwargs: dict | None) -> None:
    """Body of a scorer process: load the function, then serve tasks until EOF or ``None``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the worker; it closes the pool
    try:
        fn = resolve_target(target, kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails start-up
        conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        task_id, call_kwargs = msg
        try:
            result = fn(**call_kwargs)
            if inspect.isawaitable(result):
                if hasattr(result, "close"):
                    result.close()
                raise TypeError(
                    "the scoring function returned an awaitable; the remote manager needs a synchronous function"
                )
            reply = ("ok", task_id, result)
        except Exception as exc:  # noqa: BLE001 - the parent turns it into an error result
            reply = ("error", task_id, f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result; nothing was written
            conn.send(("error", task_id, f"cannot send the result back ({type(exc).__name__}: {exc})"))


@dataclass(eq=False)
class _Slot:
    index: int
    proc: Any
    conn: Any
    ready: bool = False
    dead: bool = False
    task_id: int | None = None
    future: asyncio.Future | None = None
    init_error: str | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int | None:
        return self.proc.pid


def describe_exit(exitcode: int | None) -> str:
    """``"killed by SIGSEGV"`` / ``"exited with code 3"`` / ``"still running"``."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class ScorerPool:
    """``num_workers`` scorer processes running one target; see the module docstring.

    Args:
        target: a spec string (``module:fn`` or ``file.py:fn``) or a picklable module-level function.
        kwargs: extra keyword arguments bound to the function in the child.
        num_workers: processes (= tasks in flight at once).
        start_method: ``"forkserver"`` (default on Linux) or ``"spawn"``. ``fork`` is refused:
            forking a process that runs an event loop, threads and torch is unsafe.
        kill_grace: seconds between SIGTERM and SIGKILL for a task that timed out.
        start_timeout: seconds to wait for the processes to load the function at start-up.
    """

    def __init__(
        self,
        target: str | Callable[..., Any],
        kwargs: dict | None = None,
        *,
        num_workers: int = 2,
        start_method: str | None = None,
        kill_grace: float = 1.0,
        start_timeout: float = 120.0,
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
        self.counters = {"tasks": 0, "timeouts": 0, "crashes": 0, "errors": 0, "replaced": 0}
        self._ctx = multiprocessing.get_context(start_method)
        self._slots: list[_Slot] = []
        self._free: asyncio.Queue | None = None
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._broken: str | None = None
        self._started = False
        self._init_failures = 0
        self._bg: set[asyncio.Task] = set()

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

    def _spawn(self, index: int) -> _Slot:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_child_main, args=(child_conn, self.target, self.kwargs), name=f"rewardq-scorer-{index}", daemon=True
        )
        proc.start()
        child_conn.close()
        slot = _Slot(index=index, proc=proc, conn=parent_conn)
        assert self._loop is not None
        self._loop.add_reader(parent_conn.fileno(), self._on_readable, slot)
        return slot

    async def close(self) -> None:
        """Ask every process to exit, kill the ones that do not, and fail waiting callers."""
        self._closed = True
        for task in list(self._bg):
            task.cancel()
        for slot in self._slots:
            if not slot.dead:
                try:
                    slot.conn.send(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + 2.0
        while any(s.proc.is_alive() for s in self._slots) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for slot in self._slots:
            self._detach(slot)
            if slot.future is not None and not slot.future.done():
                slot.future.set_result(TaskResult("error", message="the scorer pool was closed"))
            await self._kill(slot)
        self._slots = []
        if self._free is not None:
            self._free.put_nowait(None)

    # -- events from the children ------------------------------------------------------
    def _on_readable(self, slot: _Slot) -> None:
        try:
            while not slot.dead and slot.conn.poll():
                self._on_message(slot, slot.conn.recv())
        except (EOFError, OSError):
            self._on_dead(slot)

    def _on_message(self, slot: _Slot, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            slot.ready = True
            self._init_failures = 0
            logger.debug("scorer process %s ready in %.2fs", slot.pid, time.monotonic() - slot.started)
            if self._free is not None and not self._closed:
                self._free.put_nowait(slot)
        elif kind == "init_error":
            slot.init_error = msg[1]
            self._on_dead(slot)
        elif slot.future is not None and msg[1] == slot.task_id and not slot.future.done():
            slot.future.set_result(
                TaskResult(
                    kind,
                    value=msg[2] if kind == "ok" else None,
                    message=msg[2] if kind == "error" else "",
                    pid=slot.pid,
                )
            )

    def _on_dead(self, slot: _Slot) -> None:
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

    def _detach(self, slot: _Slot) -> None:
        if self._loop is not None:
            try:
                self._loop.remove_reader(slot.conn.fileno())
            except (OSError, ValueError):
                pass

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # -- running tasks -------------------------------------------------------------------
    async def _idle_slot(self) -> _Slot:
        if not self._slots and not self._closed:
            await self.start()
        assert self._free is not None
        while True:
            if self._closed or self._broken:
                raise ScoringError(
                    f"the scorer pool is {'closed' if self._closed else 'broken'}"
                    f"{': ' + self._broken if self._broken else ''}"
                )
            slot = await self._free.get()
            if slot is None:
                self._free.put_nowait(None)  # wake the next waiter too
                continue
            if not slot.dead and slot in self._slots:
                return slot

    async def run(self, call_kwargs: dict, timeout: float) -> TaskResult:
        """Run the function with ``call_kwargs`` in an idle process, within ``timeout`` seconds."""
        slot = await self._idle_slot()
        assert self._loop is not None and self._free is not None
        task_id = next(self._ids)
        try:
            message = bytes(ForkingPickler.dumps((task_id, call_kwargs)))
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable value in extra_info
            self._free.put_nowait(slot)
            raise ScoringError(f"cannot send the sample to a scorer process: {type(exc).__name__}: {exc}") from None
        self.counters["tasks"] += 1
        slot.task_id = task_id
        slot.future = fut = self._loop.create_future()
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
            return TaskResult("timeout", pid=slot.pid)
        except asyncio.CancelledError:  # the caller gave up: the process is busy with it, so replace it
            self._background(self._replace(slot, "task cancelled"))
            raise
        if result.status == "crash":
            self.counters["crashes"] += 1
            await self._kill(slot)
            result.message = f"the scorer process (pid {slot.pid}) {describe_exit(slot.proc.exitcode)} while scoring"
            logger.error("%s; replacing it", result.message)
            await self._replace(slot, "crash")
            return result
        if result.status == "error":
            self.counters["errors"] += 1
        slot.future = None
        slot.task_id = None
        if not self._closed:
            assert self._free is not None
            self._free.put_nowait(slot)
        return result

    async def _kill(self, slot: _Slot) -> None:
        """SIGTERM, then SIGKILL after ``kill_grace``; reap the process and close its pipe."""
        proc = slot.proc
        if proc.is_alive():
            proc.terminate()
            deadline = time.monotonic() + self.kill_grace
            while proc.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if proc.is_alive():
                proc.kill()
            while proc.is_alive():
                await asyncio.sleep(0.01)
        proc.join(timeout=0)
        try:
            slot.conn.close()
        except OSError:
            pass

    async def _replace(self, slot: _Slot, reason: str, delay: float = 0.0) -> None:
        slot.dead = True
        self._detach(slot)
        if slot.future is not None and not slot.future.done():
            slot.future.cancel()
        await self._kill(slot)
        if delay:
            await asyncio.sleep(delay)
        if self._closed or slot not in self._slots:
            return
        new = self._spawn(slot.index)
        self._slots[slot.index] = new
        self.counters["replaced"] += 1
        logger.info("scorer process %s replaced by %s (%s)", slot.pid, new.pid, reason)
