"""The body of a scorer process (:class:`rewardq.reward.execution.process_pool.ScorerPool`'s children).

A child loads its scoring function once, says ``ready``, then serves tasks until its pipe
closes or it is sent ``None``. Whatever a task does short of ending the process comes back
as a reply: its value, or its exception with the traceback, ``sys.exit()`` and
``KeyboardInterrupt`` included (``the reward function called sys.exit(3)``); the process
then serves the next task.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import traceback
from collections.abc import Callable
from typing import Any

from rewardq.errors import ConfigError
from rewardq.reward.execution.escapes import REWARD_FUNCTION, describe_escape


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
    """One task in the child: the reply to send (``ok``/``error``), whatever the function did."""
    try:
        result = fn(**call_kwargs)
        if inspect.isawaitable(result):
            if hasattr(result, "close"):
                result.close()
            raise TypeError("the scoring function returned an awaitable; scorer processes need a synchronous function")
        return ("ok", task_id, result, "")
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: an error of this task
        message = describe_escape(exc, REWARD_FUNCTION) or f"{type(exc).__name__}: {exc}"
        return ("error", task_id, message, traceback.format_exc())


def child_main(conn: Any, target: Any, kwargs: dict[str, Any] | None) -> None:
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
        reply = _call(fn, task_id, call_kwargs)
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result; nothing was written
            conn.send(("error", task_id, f"cannot send the result back ({type(exc).__name__}: {exc})", ""))
