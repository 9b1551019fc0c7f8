r"""Symbolic math scoring with Hugging Face's ``math-verify``: ``\boxed{1/2}`` equals ``0.5``.

The ground truth is read as ``\boxed{<ground_truth>}`` (LaTeX), the response with both
the plain-expression and the LaTeX extractors, and the answers are compared with
sympy (numerically to 6 decimals, then symbolically)::

    >>> compute_score("any", r"so the answer is \boxed{1/2}", "0.5")   # in a process's main thread
    1.0

**Run it in a process, never in a thread.** math-verify bounds its parsing and
comparison time with ``signal.alarm``, which only works in the main thread of a
process. In any other thread it raises on every call, and verl's wrapper swallows that
and silently scores 0.0 for every sample. Here a call off the main thread raises
:class:`~rewardq.errors.ScoringError` instead. Use it through a process pool (the
``remote`` manager), or score in the main thread of a worker process.

Needs the ``math`` extra: ``pip install 'rewardq[math]'``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rewardq.errors import ConfigError, ScoringError
from rewardq.reward.warm_up import warms_up_with

logger = logging.getLogger("rewardq.reward.scoring")

#: Decimal places used for numeric comparison (verl's ``math_metric`` default).
FLOAT_ROUNDING = 6

_THREAD_MESSAGE = (
    "math-verify uses signal.alarm for its timeouts, which only works in the main thread "
    "of a process; it was called from thread {name!r}. Score it in worker processes "
    "(--manager remote) instead of threads"
)


def _import_math_verify() -> Any:
    try:
        import math_verify
        from math_verify.errors import TimeoutException
    except ImportError:
        raise ConfigError(
            "the math-verify scorer needs the math-verify package: "
            "pip install 'rewardq[math]' (or pip install math-verify)"
        ) from None
    return math_verify, TimeoutException


@warms_up_with(_import_math_verify)  # sympy and the LaTeX parser, before a scorer process's first call
def compute_score(
    data_source: object,
    solution_str: str,
    ground_truth: object,
    extra_info: dict[str, object] | None = None,
    timeout_score: float = 0.0,
) -> float:
    r"""1.0 when some answer in ``solution_str`` equals ``\boxed{ground_truth}``, else 0.0.

    Args:
        data_source: unused (the signature matches every rewardq scoring function).
        solution_str: the decoded response.
        ground_truth: the reference answer, LaTeX without ``\boxed`` (``str()`` is applied).
        extra_info: unused.
        timeout_score: returned when math-verify's own timeout fires on a pathological input.

    Raises:
        ScoringError: called outside the main thread of a process (see the module docstring).
        ConfigError: math-verify is not installed.
    """
    current = threading.current_thread()
    if current is not threading.main_thread():
        raise ScoringError(_THREAD_MESSAGE.format(name=current.name))
    math_verify, timeout_exception = _import_math_verify()
    gold_boxed = "\\boxed{" + str(ground_truth) + "}"
    try:
        gold = math_verify.parse(gold_boxed, (math_verify.LatexExtractionConfig(),))
        if not gold:
            # verl's math_metric raises "No gold targets found" here and its wrapper scores 0.0.
            logger.debug("math-verify found no gold answer in %r", gold_boxed[:120])
            return 0.0
        pred = math_verify.parse(
            solution_str, (math_verify.ExprExtractionConfig(), math_verify.LatexExtractionConfig())
        )
        if not pred:
            return 0.0
        return 1.0 if math_verify.verify(gold, pred, FLOAT_ROUNDING) else 0.0
    except timeout_exception:
        logger.warning("math-verify timed out; scoring %s", timeout_score)
        return float(timeout_score)
    except Exception as exc:
        if isinstance(exc, ValueError) and "thread" in str(exc):  # alarm refused (e.g. a sub-interpreter)
            raise ScoringError(_THREAD_MESSAGE.format(name=current.name)) from exc
        logger.debug("math-verify failed", exc_info=True)
        return 0.0
