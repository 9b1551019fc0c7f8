"""Time limits for CPU-bound scoring steps (sympy), with ``SIGALRM``.

verl bounds each sympy comparison of ``prime_math`` by forking a child process per call
and killing it after the limit. rewardq runs these scorers in scorer processes instead
(``placement = "process"``), whose children may not start processes of their own, so the
limit here is a signal: :func:`time_limit` arms ``ITIMER_REAL`` and raises
:class:`TimeoutError` inside the block when it fires. Same outcome for the score, and no
fork per comparison.

Signals are delivered to a process's **main thread** only, so :func:`require_main_thread`
refuses any other thread up front with a :class:`~rewardq.errors.ScoringError` that says
where to score instead, rather than letting a timeout silently never fire.

A signal interrupts Python code, not one long C call (a huge integer power inside
sympy, say): such a call raises when it returns. The scorer process's own timeout (the
``remote`` manager's ``timeout``) bounds those.

Written here rather than taken from a library: a thread-based timeout cannot interrupt
sympy at all, and the signal-based one needed is these few lines (install the handler,
arm the timer, restore both, respect an outer timer).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rewardq.errors import ScoringError

__all__ = ["time_limit", "require_main_thread"]


def require_main_thread(scorer: str) -> None:
    """Raise :class:`~rewardq.errors.ScoringError` unless called in a process's main thread.

    Args:
        scorer: what needs the signal, for the message (``"the numina (prime_math) scorer"``).

    Raises:
        ScoringError: in any other thread.
    """
    current = threading.current_thread()
    if current is not threading.main_thread():
        raise ScoringError(
            f"{scorer} uses SIGALRM for its time limit, which only works in the main thread of a process; "
            f"it was called from thread {current.name!r}. Score these data sources in scorer processes "
            "(the worker does so for placement='process' scorers; or --manager remote)"
        )


@contextmanager
def time_limit(seconds: float, what: str = "the timed step") -> Iterator[None]:
    """Raise :class:`TimeoutError` in the ``with`` block once ``seconds`` have passed.

    An outer ``ITIMER_REAL`` that would fire sooner is left alone (the outer limit wins);
    a later one is re-armed on exit with the time it has left.

    Raises:
        ScoringError: not in the main thread (see :func:`require_main_thread`).
    """
    require_main_thread(what)
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    if outer_delay and outer_delay <= seconds:
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"{what} took longer than {seconds:g}s")

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay:
            left = outer_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), outer_interval)
