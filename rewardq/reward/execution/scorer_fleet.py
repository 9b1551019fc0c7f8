"""The processes of a scorer pool: started, replaced when killed, spares started for calls
waiting behind stuck ones, surplus retired when idle.

:class:`ScorerFleet` is the base of :class:`~rewardq.reward.execution.process_pool.ScorerPool`,
which decides which call goes to which process (and holds the calls: ``_pending``, ``_kill``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import multiprocessing
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rewardq.errors import ConfigError
from rewardq.reward.execution.escapes import describe_exit
from rewardq.reward.execution.scorer_slot import PoolCall, ScorerSlot
from rewardq.reward.execution.settings import SCORER_OUTPUT_CAP, SCORER_REPLY_BYTES, SCORER_SPARE_IDLE
from rewardq.reward.execution.spares import SparePolicy

#: Calls each scorer process holds queued behind the one it runs, as ``ProcessPoolExecutor`` does:
#: it begins the next the moment it replies (the pool takes a queued call back when it could be held up).
SCORER_QUEUE_AHEAD = 1


#: Scorer processes in a pool built without a count (the ``remote`` manager's ``num_workers``).
REMOTE_NUM_WORKERS = 2
#: Seconds between SIGTERM and SIGKILL for a scorer process that must stop.
KILL_GRACE = 1.0
#: Seconds a new scorer process may take to load its function before its start counts as failed.
SCORER_START_TIMEOUT = 120.0


logger = logging.getLogger("rewardq.reward.remote")

START_METHODS = ("forkserver", "spawn")


class ScorerFleet:
    """The processes of a :class:`~rewardq.reward.execution.process_pool.ScorerPool`: starting them, spares,
    retiring and replacing them; which call goes where is the pool's.

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
        reply_cap: bytes of one reply (the pickled result) a process may send back; a larger one is
            refused in the process and becomes an error naming it (:mod:`.scorer_process`).
        policy: the spare rules in full (tests); overrides ``spare_after``, ``max_spares`` and
            ``spare_idle``.
        ahead: calls each process holds queued behind the one it runs (0: none, as before).
    """

    def __init__(
        self,
        target: str | Callable[..., object],
        kwargs: dict[str, object] | None = None,
        *,
        num_workers: int = REMOTE_NUM_WORKERS,
        start_method: str | None = None,
        kill_grace: float = KILL_GRACE,
        start_timeout: float = SCORER_START_TIMEOUT,
        spare_after: float | None = None,
        max_spares: int = 0,
        spare_idle: float = SCORER_SPARE_IDLE,
        output_cap: int = SCORER_OUTPUT_CAP,
        reply_cap: int = SCORER_REPLY_BYTES,
        policy: SparePolicy | None = None,
        ahead: int = SCORER_QUEUE_AHEAD,
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
        self.reply_cap = int(reply_cap)
        self.ahead = max(0, int(ahead))
        self.counters = {
            "tasks": 0,
            "timeouts": 0,
            "crashes": 0,
            "errors": 0,
            "replaced": 0,
            "spares": 0,
            "retired": 0,
            "output_cut": 0,
            "taken_back": 0,
        }
        self._ctx: Any = multiprocessing.get_context(start_method)
        self._slots: list[ScorerSlot] = []
        self._pending: collections.deque[PoolCall] = collections.deque()  # calls no process holds
        self._ids = itertools.count(1)
        self._names = itertools.count(num_workers)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._broken: str | None = None
        self._started = False
        self._init_failures = 0
        self._dispatching = False
        self._again = False
        self._watch: asyncio.TimerHandle | None = None  # looks for stuck processes while calls wait
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
        slot = ScorerSlot.start(
            self._ctx, index, self.target, self.kwargs, output_cap=self.output_cap, reply_cap=self.reply_cap
        )
        assert self._loop is not None
        self._loop.add_reader(slot.conn.fileno(), self._on_readable, slot)
        if self._started:  # a replacement or a spare: held to the start-up's deadline too
            self._loop.call_later(self.start_timeout, self._on_ready_deadline, slot)
        return slot

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

    def _able(self, now: float) -> int:
        return self.spares.able(self._slots, now)

    def _start_spare_if_stuck(self) -> None:
        """Start a spare for a waiting call when one is due (see :mod:`rewardq.reward.execution.spares`)."""
        if self._closed or self._broken or self._loop is None or not self._pending:
            return
        now = time.monotonic()
        if not self.spares.spare_due(self._slots, len(self._pending), self.num_workers, now):
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
            len(self._pending),
            alive + 1 - self.num_workers,
            self.spares.most,
        )

    def _note_idle(self, now: float) -> None:
        """A process went idle: when more than ``num_workers`` can take work, the surplus exits
        once idle for ``spare_idle`` seconds."""
        if self._closed or self._loop is None:
            return
        if self._trim is None and self._able(now) > self.num_workers:
            self._trim = self._loop.call_later(self.spares.idle, self._trim_surplus)

    def _trim_surplus(self) -> None:
        """Retire the processes beyond ``num_workers`` that have been idle for ``spare_idle`` seconds."""
        self._trim = None
        if self._closed or self._loop is None:
            return
        now = time.monotonic()
        for slot in self.spares.to_retire(self._slots, len(self._pending), self.num_workers, now):
            self._slots.remove(slot)  # no call is handed to it from now on
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
        if not slot.dead:
            self._kill(slot)
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

    # -- what the pool provides ------------------------------------------------------------
    def _on_readable(self, slot: ScorerSlot) -> None:
        raise NotImplementedError

    def _kill(self, slot: ScorerSlot) -> None:
        raise NotImplementedError

    def _on_ready_deadline(self, slot: ScorerSlot) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError
