"""A scoring function's warm-up: its heavy imports, run once when a scorer process starts.

A scorer process times each call from when it begins it. A function that imports a large
library on its first call (math-verify's sympy and ANTLR parsers: ~1-2 s of CPU on a quiet
machine, over 30 s on a loaded one) would count that import against its first call's timeout
in every new process, and time that call out on a busy node. A function marked with
:func:`warms_up_with` has its warm-up run by each scorer process before the process says it is
ready, so no call counts it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])

_ATTRIBUTE = "rewardq_warm_up"


def warms_up_with(warm_up: Callable[[], object]) -> Callable[[F], F]:
    """Mark a scoring function: ``warm_up()`` (no arguments) runs once in each scorer process
    before its first call."""

    def mark(fn: F) -> F:
        setattr(fn, _ATTRIBUTE, warm_up)
        return fn

    return mark


def run_warm_up(fn: Callable[..., object]) -> None:
    """Run ``fn``'s warm-up, if it has one (also through :func:`functools.partial`).

    A warm-up that fails is left for the calls to report: the first call meets the same error
    (a missing package, say) and returns it as that trajectory's error result, with its own
    message, as it would without a warm-up.
    """
    base = fn.func if isinstance(fn, functools.partial) else fn
    warm_up = getattr(base, _ATTRIBUTE, None)
    if callable(warm_up):
        try:
            warm_up()
        except BaseException:  # noqa: BLE001 - SystemExit too: reported by the first call (see the docstring)
            pass
