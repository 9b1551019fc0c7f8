"""Words for what user code did instead of returning: an exit, an interrupt, a dead process.

Every failure of a reward function or manager ends as an error result for its trajectory
whose reason names what the code did (``the reward function called sys.exit(3)``), so the
person reading the dead letter knows where to look. These helpers write those reasons; they
import nothing from rewardq, so both a worker and a scorer process can use them.
"""

from __future__ import annotations

import signal

#: How the reasons name a user's reward function (``the reward function called sys.exit(3)``).
REWARD_FUNCTION = "the reward function"

#: Signals that mean the code itself crashed in native code.
_NATIVE_CRASHES = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"})


def exit_call(exc: SystemExit) -> str:
    """``sys.exit(3)``, ``sys.exit()`` or ``sys.exit('bye')``: the call that raised ``exc``."""
    return "sys.exit()" if exc.code is None else f"sys.exit({exc.code!r})"


def describe_escape(exc: BaseException, who: str) -> str | None:
    """The reason for a ``SystemExit`` or ``KeyboardInterrupt`` raised by ``who``; None for anything else.

    Both must end one trajectory, never the worker: asyncio re-raises them out of the event
    loop, which would stop the worker as if it had been asked to.
    """
    if isinstance(exc, SystemExit):
        return f"{who} called {exit_call(exc)}"
    if isinstance(exc, KeyboardInterrupt):
        return f"{who} raised KeyboardInterrupt"
    return None


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


def exit_hint(exitcode: int | None) -> str:
    """What usually causes a process to end with ``exitcode`` (``""`` when nothing useful)."""
    if exitcode is None:
        return ""
    if exitcode >= 0:
        return "os._exit, or a fatal error in native code?"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return ""
    if name in _NATIVE_CRASHES:
        return "a crash in native code"
    if name == "SIGKILL":
        return "out of memory, or killed from outside?"
    return ""
