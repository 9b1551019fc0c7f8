"""A small process pool for scoring functions, with per-task timeouts that kill.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop one hung task (a
cancelled future keeps its worker busy forever) and a worker that dies breaks the whole
pool. Why not threads: CPU-bound scorers hold the GIL, a hung thread can never be stopped,
and math-verify's timeouts use ``signal.alarm``, which only works in a process's main thread.

Design: one ``multiprocessing`` Process and one duplex Pipe per slot
(:class:`~rewardq.reward.execution.scorer_slot.ScorerSlot`). A child loads the scoring function once,
says ``ready``, then loops: receive ``(task_id, kwargs)``, call the function **in its main
thread**, send back ``ok``/``error``. The parent watches every pipe with ``loop.add_reader`` (no
thread per slot), so a reply or the EOF of a dead child wakes the event loop directly, and hands
out calls in that callback, without a task switch.

**One call queued ahead.** As ``concurrent.futures.ProcessPoolExecutor`` does, each process is
sent its next call while it runs one (``ahead``, 1 by default), so it starts the next the moment
it replies instead of waiting for the parent to get a core and hand it over. A queued call is
never held up by the call before it: the pool takes it back and sends it elsewhere when that
call's process times out, dies or counts as stuck (:mod:`~rewardq.reward.execution.spares`), and
whenever another process goes idle with nothing waiting. Taking back sends ``("revoke", id)``
behind the call; the child drops it unread (``("revoked", id)``) or, if it had already begun it,
runs it for nobody (its reply is ignored and its time still bounded by its timeout), and the
process gets no new call until that is settled. A call queued ahead has not started: its timeout
and its trajectory's clock start when its process begins it (the parent knows when: a process
runs its calls in order, so a reply starts the next).

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

A task's timeout counts from when its process begins it, not from when it was queued, and
while a call waits for a process (or sits queued ahead in one) its trajectory's clock stands still
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
import signal
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any

from rewardq.errors import ScoringError
from rewardq.reward.execution.budget import current_budget, waiting_for_a_place
from rewardq.reward.execution.escapes import REWARD_FUNCTION, describe_exit, exit_hint
from rewardq.reward.execution.scorer_fleet import START_METHODS, ScorerFleet, logger
from rewardq.reward.execution.scorer_output import describe_cut
from rewardq.reward.execution.scorer_slot import PoolCall, ScorerSlot, Sent, TaskResult

__all__ = ["START_METHODS", "ScorerPool"]


class ScorerPool(ScorerFleet):
    """``num_workers`` scorer processes running one target; see the module docstring and
    :class:`~rewardq.reward.execution.scorer_fleet.ScorerFleet` for the arguments."""

    async def close(self) -> None:
        """Stop every process within about a second and fail waiting callers.

        Idle processes are asked to exit, busy ones are sent SIGTERM at once (their callers
        are going away too, and what their calls forked is killed first), and whatever is still
        alive a second later is killed.
        """
        self._closed = True
        for handle in (self._trim, self._watch):
            if handle is not None:
                handle.cancel()
        self._trim = self._watch = None
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
            for sent in slot.sent:
                if sent.call is not None:
                    sent.call.finish(TaskResult("error", message="the scorer pool was closed"))
            slot.sent.clear()
            await slot.stop(grace=0.0)
        self._slots = []
        self._leaving.clear()
        self._fail_pending()

    def _fail_pending(self) -> None:
        """Fail every call no process holds (the pool closed or broke)."""
        why = ScoringError(
            f"the scorer pool is {'closed' if self._closed else 'broken'}{': ' + self._broken if self._broken else ''}"
        )
        while self._pending:
            self._pending.popleft().finish(why)

    # -- events from the children ------------------------------------------------------
    def _on_readable(self, slot: ScorerSlot) -> None:
        try:
            while not slot.dead and slot.conn.poll():
                self._on_message(slot, slot.conn.recv())
        except (EOFError, OSError):
            self._on_dead(slot)
        self._dispatch()

    def _on_message(self, slot: ScorerSlot, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "ready":
            slot.ready = True
            slot.own_group = bool(msg[2]) if len(msg) > 2 else False
            slot.idle_since = time.monotonic()
            self._init_failures = 0
            logger.debug("scorer process %s ready in %.2fs", slot.pid, time.monotonic() - slot.started)
        elif kind == "output":
            self.counters["output_cut"] += 1
            for stream, written, dropped in msg[2]:
                logger.warning("scorer process %s: %s", slot.pid, describe_cut(stream, written, dropped, msg[1] == 0))
        elif kind == "init_error":
            slot.init_error = msg[1]
            self._on_dead(slot)
        elif kind == "revoked":  # a call taken back, dropped unread: the process runs what follows it
            for sent in slot.sent:
                if sent.task_id == msg[1] and sent.call is None:
                    running = sent is slot.sent[0]
                    slot.sent.remove(sent)
                    if running:
                        self._begin(slot)
                    break
        elif slot.sent and msg[1] == slot.sent[0].task_id:  # the reply to the call it ran
            sent = slot.sent.popleft()
            call = sent.call
            if call is not None and call.slot is slot:
                if kind == "error":
                    self.counters["errors"] += 1
                call.finish(
                    TaskResult(
                        kind,
                        value=msg[2] if kind == "ok" else None,
                        message=msg[2] if kind == "error" else "",
                        pid=slot.pid,
                        traceback=msg[3] if kind == "error" and len(msg) > 3 else "",
                        failure_kind=msg[4] if kind == "error" and len(msg) > 4 else None,
                        retry_after=msg[5] if kind == "error" and len(msg) > 5 else None,
                    )
                )
            self._begin(slot)

    def _on_dead(self, slot: ScorerSlot) -> None:
        if slot.dead:
            return
        slot.dead = True
        self._detach(slot)
        self._take_back(slot, revoke=False)
        running = slot.sent[0].call if slot.sent else None
        slot.sent.clear()
        if running is not None and running.slot is slot:
            self._background(self._after_crash(slot, running))
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
                self._fail_pending()

    def _on_ready_deadline(self, slot: ScorerSlot) -> None:
        """A replacement or spare still not ready ``start_timeout`` after it started (its function's
        load or warm-up hangs): it counts as a failed load (replaced, up to three times, then the
        pool is broken and its waiting calls fail saying why) and its process is stopped."""
        if slot.ready or slot.dead or self._closed:
            return
        slot.init_error = f"not ready after {self.start_timeout:g}s (loading or warming up the function)"
        self._on_dead(slot)
        self._background(slot.stop(self.kill_grace))
        self._dispatch()

    async def _after_crash(self, slot: ScorerSlot, call: PoolCall) -> None:
        """The process running ``call`` died: reap it, tell the caller how it ended, replace it."""
        self.counters["crashes"] += 1
        await slot.stop(self.kill_grace)
        code = slot.proc.exitcode
        hint = exit_hint(code)
        message = f"{REWARD_FUNCTION}'s process (pid {slot.pid}) {describe_exit(code)} while scoring" + (
            f" ({hint})" if hint else ""
        )
        logger.error("%s; replacing it", message)
        await self._replace(slot, "crash")
        call.finish(TaskResult("crash", pid=slot.pid, message=message))

    # -- handing out calls -----------------------------------------------------------------
    def _begin(self, slot: ScorerSlot) -> None:
        """``slot``'s process begins the first call it holds (or is idle when it holds none)."""
        now = time.monotonic()
        slot.cpu_mark, slot.stuck_seen = None, False
        if not slot.sent:
            slot.busy_since, slot.threshold = None, None
            slot.idle_since = now
            self._note_idle(now)
            return
        sent = slot.sent[0]
        slot.busy_since = now
        slot.threshold = self.spares.threshold(sent.timeout)
        call = sent.call
        if call is not None and not call.started.done():
            call.started.set_result(None)
        if sent.timeout is not None:
            assert self._loop is not None
            handle = self._loop.call_later(sent.timeout, self._on_timeout, slot, sent)
            if call is not None:
                call.timer = handle

    def _dispatch(self) -> None:
        """Hand the waiting calls to processes: an idle one first, else one queue-ahead place each;
        with nothing waiting, an idle process takes a call queued behind a busy one."""
        if self._dispatching:
            self._again = True
            return
        self._dispatching = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._hand_out()
        finally:
            self._dispatching = False
        self._arm_watch()

    def _hand_out(self) -> None:
        if self._closed or self._broken:
            self._fail_pending()
            return
        now = time.monotonic()
        while self._pending:
            slot = self._place(now)
            if slot is None:
                return
            self._send(slot, self._pending.popleft())
        idle = [s for s in self._slots if self._usable(s) and not s.sent]
        for slot in idle:
            queued = next(
                (
                    s
                    for s in self._slots
                    if len(s.sent) > 1 and s.sent[-1].call is not None and s.sent[-1].call.slot is s
                ),
                None,
            )
            if queued is None:
                return
            self._take_back(queued, revoke=True, last_only=True)
            self._send(slot, self._pending.popleft())

    def _usable(self, slot: ScorerSlot) -> bool:
        return slot.ready and not slot.dead and slot in self._slots

    def _place(self, now: float) -> ScorerSlot | None:
        """An idle process, else one of the pool's own (not a spare) with room queued ahead, the one
        that began its call first. Nothing is queued ahead while any process's call is past the time
        it could count as stuck (it may hang: calls wait unsent until that is settled), nor in a
        process a call was taken back from until its process settled it."""
        best: ScorerSlot | None = None
        doubt = False
        for slot in self._slots:
            since, threshold = slot.busy_since, slot.threshold
            if since is not None and threshold is not None and now - since >= threshold:
                doubt = True
            if not self._usable(slot):
                continue
            if not slot.sent:
                return slot
            if slot.index >= self.num_workers or len(slot.sent) > self.ahead or since is None:
                continue
            if any(s.call is None for s in slot.sent):
                continue
            if best is None or (best.busy_since or 0.0) > since:
                best = slot
        return None if doubt else best

    def _send(self, slot: ScorerSlot, call: PoolCall) -> None:
        call.slot = slot
        slot.sent.append(Sent(call.task_id, call.timeout, call))
        try:
            slot.conn.send_bytes(call.message)
        except (OSError, ValueError):
            self._on_dead(slot)
            return
        if len(slot.sent) == 1:
            self._begin(slot)

    def _take_back(self, slot: ScorerSlot, *, revoke: bool, last_only: bool = False) -> None:
        """Put the calls queued ahead in ``slot`` (not the one it runs; ``last_only``: the last of
        them) back behind the waiting calls; ``revoke``: tell its process to drop them (else it is
        dead). Behind, not in front: a call queued behind a stuck one may hang too, and the calls
        that waited meanwhile go first to the next free process (a spare, often)."""
        queued = list(slot.sent)[1:]
        back = []
        for sent in queued[-1:] if last_only else queued:
            call = sent.call
            if call is None or call.slot is not slot:
                continue
            sent.call, call.slot = None, None
            back.append(call)
            if revoke:
                try:
                    slot.conn.send(("revoke", sent.task_id))
                except (OSError, ValueError):
                    pass
        self.counters["taken_back"] += len(back)
        self._pending.extend(back)

    # -- stuck processes and spares -----------------------------------------------------------
    def _arm_watch(self) -> None:
        """While calls wait or sit queued ahead, look for stuck processes when one could be."""
        if self._watch is not None or self._closed or self._loop is None or not self.spares.enabled:
            return
        if not self._pending and not any(len(s.sent) > 1 for s in self._slots):
            return
        delay = self.spares.check_in(self._slots, time.monotonic())
        if delay is not None:
            self._watch = self._loop.call_later(delay, self._on_watch)

    def _on_watch(self) -> None:
        self._watch = None
        if self._closed:
            return
        now = time.monotonic()
        for slot in self._slots:
            if len(slot.sent) > 1 and not slot.dead and self.spares.slot_stuck(slot, now):
                self._take_back(slot, revoke=True)
        self._start_spare_if_stuck()
        self._dispatch()

    # -- running tasks -------------------------------------------------------------------
    async def run(self, call_kwargs: dict[str, Any], timeout: float | None = None) -> TaskResult:
        """Run the function with ``call_kwargs`` in a scorer process, within ``timeout`` seconds.

        ``timeout`` None: the current trajectory's budget (:func:`~rewardq.reward.execution.budget.current_budget`),
        if any, else no limit of its own; a caller that gives up (cancels) still gets its process
        killed and replaced if the call had begun (else the call is taken back). The timeout counts
        from when a process begins the call; until then, its trajectory's clock stands still.
        """
        task_id = next(self._ids)
        try:
            message = bytes(ForkingPickler.dumps((task_id, call_kwargs)))
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable value in extra_info
            raise ScoringError(f"cannot send the sample to a scorer process: {type(exc).__name__}: {exc}") from None
        if timeout is None:
            budget = current_budget()
            timeout = budget.seconds if budget is not None else None
        if not self._slots and not self._closed:
            with waiting_for_a_place():
                await self.start()
        if self._closed or self._broken:
            raise ScoringError(
                f"the scorer pool is {'closed' if self._closed else 'broken'}"
                f"{': ' + self._broken if self._broken else ''}"
            )
        assert self._loop is not None
        call = PoolCall(task_id, message, timeout, self._loop.create_future(), self._loop.create_future())
        self.counters["tasks"] += 1
        self._pending.append(call)
        self._dispatch()
        try:
            if not call.started.done():
                with waiting_for_a_place():
                    await asyncio.shield(call.started)
            return await asyncio.shield(call.done)
        except asyncio.CancelledError:
            self._withdraw(call)
            raise

    def _withdraw(self, call: PoolCall) -> None:
        """The caller gave up: a waiting call is dropped, a queued one taken back, a running one's
        process replaced (it is busy with a call nobody waits for)."""
        slot = call.slot
        if call.done.done():
            return
        call.abandon()
        if slot is None:
            if call in self._pending:
                self._pending.remove(call)
            return
        call.slot = None
        if slot.sent and slot.sent[0].call is call:
            self._kill(slot)
            self._background(self._replace(slot, "its caller gave up (timeout or shutdown)"))
        else:
            for sent in slot.sent:
                if sent.call is call:
                    sent.call = None
                    try:
                        slot.conn.send(("revoke", sent.task_id))
                    except (OSError, ValueError):
                        pass
        self._dispatch()

    def _on_timeout(self, slot: ScorerSlot, sent: Sent) -> None:
        """``sent`` ran past its timeout: its process is killed and replaced, the calls queued
        behind it go elsewhere at once, and its caller hears once the process is gone."""
        if slot.dead or not slot.sent or slot.sent[0] is not sent:
            return
        call = sent.call
        if call is not None:
            self.counters["timeouts"] += 1
            logger.warning(
                "scorer process %s exceeded its %.1fs timeout; killing and replacing it", slot.pid, sent.timeout
            )
        self._kill(slot)

        async def replace() -> None:
            await self._replace(slot, "timeout")
            if call is not None:
                call.finish(TaskResult("timeout", pid=slot.pid, message=f"{sent.timeout:g}s"))

        self._background(replace())
        self._dispatch()

    def _kill(self, slot: ScorerSlot) -> None:
        """Count ``slot`` out at once: no more replies read, its queued calls go elsewhere."""
        self._detach(slot)
        slot.dead = True
        self._take_back(slot, revoke=False)
        slot.sent.clear()
