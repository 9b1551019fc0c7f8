"""The body of a scorer process (:class:`rewardq.reward.execution.process_pool.ScorerPool`'s children).

A child loads its scoring function once, says ``ready``, then serves tasks until its pipe
closes or it is sent ``None``. Whatever a task does short of ending the process comes back
as a reply: its value, or its exception with the traceback, ``sys.exit()`` and
``KeyboardInterrupt`` included (``the reward function called sys.exit(3)``); the process
then serves the next task, in a process put back as it was (working directory, environment,
signal handlers), without the children the task left behind, and with its output capped in the
worker's log.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import traceback
from collections.abc import Callable
from typing import Any

from rewardq import defaults
from rewardq.errors import ConfigError
from rewardq.queue.states import failure_kind_of
from rewardq.reward.execution.escapes import REWARD_FUNCTION, describe_escape
from rewardq.reward.execution.scorer_children import become_reaper, children, kill_leftovers
from rewardq.reward.execution.scorer_output import CappedOutput, StreamCount
from rewardq.reward.execution.scorer_state import ProcessState


def resolve_target(target: str | Callable[..., Any], kwargs: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The callable a spec names (with ``kwargs`` bound), or ``target`` itself with ``kwargs`` bound."""
    if not callable(target):
        from rewardq.reward.execution.loader import load_score_fn

        fn = load_score_fn(target, dict(kwargs or {}))
        if fn is None:
            raise ConfigError("the scorer process was given an empty scoring-function spec")
        return fn
    return functools.partial(target, **kwargs) if kwargs else target


def _call(fn: Callable[..., Any], task_id: int, call_kwargs: dict[str, Any]) -> tuple[Any, ...]:
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
        retry_after = getattr(exc, "retry_after", None)
        return (
            "error",
            task_id,
            message,
            traceback.format_exc(),
            failure_kind_of(exc).value,
            float(retry_after) if isinstance(retry_after, (int, float)) else None,
        )


def child_main(
    conn: Any,
    target: Any,
    kwargs: dict[str, Any] | None,
    output_cap: int = defaults.SCORER_OUTPUT_CAP,
    die_with_parent: bool = False,
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
    state = ProcessState()
    spared = children(os.getpid())  # started while loading: the function's own helpers
    _report(conn, 0, output.end_call())
    conn.send(("ready", os.getpid(), os.getpgid(0) == os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        task_id, call_kwargs = msg
        reply = _call(fn, task_id, call_kwargs)
        state.restore()
        kill_leftovers(spared)
        _report(conn, task_id, output.end_call())
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result; nothing was written
            conn.send(("error", task_id, f"cannot send the result back ({type(exc).__name__}: {exc})", ""))


def _report(conn: Any, task_id: int, counts: list[StreamCount]) -> None:
    cut = [(c.name, c.written, c.dropped) for c in counts if c.dropped]
    if cut:
        conn.send(("output", task_id, cut))
