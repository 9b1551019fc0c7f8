"""The body of a scorer process (:class:`rewardq.reward.execution.process_pool.ScorerPool`'s children).

A child loads its scoring function once, says ``ready``, then serves tasks until its pipe
closes or it is sent ``None``, in the order they were sent; the parent may send a call's
successor while it runs (a call queued ahead) and take one back (``("revoke", id)``) before it
begins. Whatever a task does short of ending the process comes back
as a reply: its value, or its exception with the traceback, ``sys.exit()`` and
``KeyboardInterrupt`` included (``the reward function called sys.exit(3)``); the process
then serves the next task, in a process put back as it was (working directory, environment,
signal handlers), without the children the task left behind, and with its output capped in the
worker's log.

A reply is measured before it is sent: it is pickled into a buffer that refuses to grow past
``reply_cap`` bytes (:class:`CappedBuffer`), so a reward function returning 1 GiB of extra info
costs its own process the memory, never the worker, and the reply is an error naming the cap.
"""

from __future__ import annotations

import collections
import functools
import inspect
import os
import signal
import traceback
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

from rewardq.errors import ConfigError
from rewardq.queue.states import failure_kind_of
from rewardq.reward.execution.escapes import REWARD_FUNCTION, describe_escape
from rewardq.reward.execution.scorer_children import become_reaper, children, kill_leftovers
from rewardq.reward.execution.scorer_output import CappedOutput, StreamCount
from rewardq.reward.execution.scorer_state import ProcessState
from rewardq.reward.execution.settings import SCORER_OUTPUT_CAP, SCORER_REPLY_BYTES, SCORER_REPLY_FACTOR
from rewardq.reward.http import retry_after_of
from rewardq.reward.warm_up import run_warm_up


def resolve_target(
    target: str | Callable[..., object], kwargs: dict[str, object] | None = None
) -> Callable[..., object]:
    """The callable a spec names (with ``kwargs`` bound), or ``target`` itself with ``kwargs`` bound."""
    if not callable(target):
        from rewardq.reward.execution.loader import load_score_fn

        fn = load_score_fn(target, dict(kwargs or {}))
        if fn is None:
            raise ConfigError("the scorer process was given an empty scoring-function spec")
        return fn
    return functools.partial(target, **kwargs) if kwargs else target


def _call(fn: Callable[..., object], task_id: int, call_kwargs: dict[str, object]) -> tuple[Any, ...]:
    """One task in the child: the reply to send (``ok``/``error``), whatever the function did.

    An error says its failure kind (:func:`~rewardq.queue.states.failure_kind_of`, decided here
    from the exception's class, which the parent never sees) and its ``retry_after``, so an
    unknown data source stays ``config`` and a judge's 503 ``transient`` across the process hop.
    """
    try:
        result = fn(**call_kwargs)
        if inspect.isawaitable(result):
            if hasattr(result, "close"):
                result.close()
            raise TypeError("the scoring function returned an awaitable; scorer processes need a synchronous function")
        return ("ok", task_id, result, "")
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: an error of this task
        message = describe_escape(exc, REWARD_FUNCTION) or f"{type(exc).__name__}: {exc}"
        return ("error", task_id, message, traceback.format_exc(), failure_kind_of(exc).value, retry_after_of(exc))


class _TooLarge(Exception):
    pass


class CappedBuffer:
    """A file a pickler writes into, refusing (``_TooLarge``) to hold more than ``cap`` bytes."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()

    def write(self, b: Any) -> int:
        n = memoryview(b).nbytes
        if len(self.data) + n > self.cap:
            raise _TooLarge
        self.data += b
        return n


def packed_reply(reply: tuple[object, ...], cap: int) -> bytes:
    """``reply`` pickled as ``Connection.send`` would, or the error reply saying it is over ``cap``
    bytes (the pickling stops there: the rest is never serialised)."""
    buf = CappedBuffer(cap)
    try:
        # the same bytes Connection.send would write on this local pipe (never Redis's wire);
        # protocol -1 is the highest, as multiprocessing uses
        ForkingPickler(buf, -1).dump(reply)
    except _TooLarge:
        message = (
            f"the reward function's result is over the {cap:,} bytes a scorer process may send back "
            f"({SCORER_REPLY_FACTOR} x max_result_bytes, at least 8 MiB): it was refused in the "
            "scorer process, before it reached the worker; return less extra info, or raise max_result_bytes"
        )
        return bytes(ForkingPickler.dumps(("error", reply[1], message, "", "scorer", None)))
    return bytes(buf.data)


def child_main(
    conn: Any,
    target: Any,
    kwargs: dict[str, Any] | None,
    output_cap: int = SCORER_OUTPUT_CAP,
    die_with_parent: bool = False,
    reply_cap: int = SCORER_REPLY_BYTES,
) -> None:
    """Body of a scorer process: load the function, then serve tasks until EOF or ``None``.

    After each call, before its reply: the process state is put back
    (:class:`~rewardq.reward.execution.scorer_state.ProcessState`), the children the call left are
    killed (:func:`~rewardq.reward.execution.scorer_children.kill_leftovers`), and what it printed beyond
    ``output_cap`` bytes per stream is reported (``("output", task_id, [(stream, written,
    dropped), ...])``) instead of forwarded to the log.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the worker; it closes the pool
    become_reaper(die_with_parent=die_with_parent)  # with the forkserver, which ends with the worker
    output = CappedOutput(output_cap)
    try:
        fn = resolve_target(target, kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails start-up
        conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
        output.end_call()
        return
    run_warm_up(fn)  # its heavy imports, before "ready": no call's timeout counts them
    state = ProcessState()
    spared = children(os.getpid())  # started while loading: the function's own helpers
    _report(conn, 0, output.end_call())
    conn.send(("ready", os.getpid(), os.getpgid(0) == os.getpid()))
    inbox: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
    while True:
        try:
            if not inbox and not _take(conn, inbox, conn.recv()):
                return
            while conn.poll():  # calls queued ahead, and what the parent took back of them
                if not _take(conn, inbox, conn.recv()):
                    return
        except (EOFError, OSError):
            return
        if not inbox:
            continue
        task_id, call_kwargs = inbox.popleft()
        reply = _call(fn, task_id, call_kwargs)
        state.restore()
        kill_leftovers(spared)
        _report(conn, task_id, output.end_call())
        try:
            data = packed_reply(reply, reply_cap)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result; nothing was written
            conn.send(("error", task_id, f"cannot send the result back ({type(exc).__name__}: {exc})", ""))
            continue
        del reply
        conn.send_bytes(data)


def _take(conn: Any, inbox: collections.deque[tuple[int, dict[str, Any]]], msg: Any) -> bool:
    """File one message from the parent: a call joins ``inbox``; ``("revoke", id)`` drops that call
    if it has not begun (saying ``("revoked", id)``; one that ran already replied); False for ``None``
    (exit)."""
    if msg is None:
        return False
    if msg[0] == "revoke":
        for queued in inbox:
            if queued[0] == msg[1]:
                inbox.remove(queued)
                conn.send(("revoked", msg[1]))
                break
        return True
    inbox.append(msg)
    return True


def _report(conn: Any, task_id: int, counts: list[StreamCount]) -> None:
    cut = [(c.name, c.written, c.dropped) for c in counts if c.dropped]
    if cut:
        conn.send(("output", task_id, cut))
