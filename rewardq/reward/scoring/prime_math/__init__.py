r"""The ``numina_*`` scorer: verl's ``prime_math``, 1.0 when the response's answer equals the ground truth.

Used for ``numina_aops_forum``, ``numina_synthetic_math``, ``numina_amc_aime``,
``numina_synthetic_amc``, ``numina_cn_k12`` and ``numina_olympiads``, scoring exactly as
verl 0.9.1 does (the ``tests/verl`` parity suite compares the two)::

    >>> compute_score(r"... so the answer is $\boxed{\dfrac{1}{2}}$", "0.5")   # main thread of a process
    1.0

1. **Find the answer** (:func:`match_answer`): cut after the last ``answer:`` /
   ``answer is`` / ``answers are``, before a trailing ``is the answer``; take the last
   ``\boxed{}`` (or ``\fbox{}``) if any; drop a last sentence after ``". "``; keep what
   follows the last ``be``, ``is``, ``are``, ``=``, ``:``, ``get``.
2. **Grade it** with the PRM800K grader (:mod:`.prm800k`): Hendrycks normalisation,
   then a second normalisation (units, ``\text{}``, LaTeX to text), then sympy on the
   difference, at most :data:`~rewardq.reward.scoring.prime_math.arith.PRIME_MATH_SYMPY_TIMEOUT` seconds per part.
3. If that says no, **grade it again** with the ToRA grader (:mod:`.tora`): numbers
   within 1e-4 (also x100 and /100), intervals, tuples, points, matrices; with ``\pi``
   in either answer, tried with pi = 3.141592653589793 and with 3.14.

The score is 1.0 or 0.0. A malformed response (no answer, unbalanced braces, text)
scores 0.0; nothing in it makes the scorer raise.

**Where it runs.** sympy is CPU-heavy and its time limit is a ``SIGALRM``
(:mod:`rewardq.reward.scoring.time_limit`), so this scorer has ``placement = "process"``
and refuses to run outside a process's main thread. It needs the ``math`` extra
(``pip install 'rewardq[math]'``); without it a sample gets an error result naming that.

**Where it differs from verl's code, never in a score it gives:**

* verl runs each sympy comparison in a forked child and kills it after 10 s; here the
  same 10 s limit is a signal in the scorer process (no fork per comparison).
* verl passes the model's text to ``eval()`` (when it contains ``\pi``, and for
  ``[...]`` answers to a matrix); here :mod:`.arith` evaluates the same arithmetic
  without running code, and refuses names, calls and numbers too large to compute
  quickly (verl would run those, or hang).
* verl parses ``Matrix(...)`` answers with sympy without a limit; here only plain
  matrix text is parsed, under the same 10 s limit.
* verl's ToRA grader ends with a symbolic check that never runs (its time-limit helper
  is used as a context manager, which it is not, so the check always answers "not
  equal"); it is left out here, which gives the same answers.
"""

from __future__ import annotations

import math

from rewardq.reward.scoring.math_boxed import balanced_from
from rewardq.reward.scoring.math_extra import import_math_extra
from rewardq.reward.scoring.placement import place
from rewardq.reward.scoring.time_limit import require_main_thread

__all__ = ["compute_score", "score", "match_answer", "last_boxed_content"]

#: Markers after which the answer follows, tried in order (each cuts the text further).
LEAD_MARKERS = ("answer:", "answer is", "answers are")
#: Markers before which the answer stands.
TRAIL_MARKERS = ("is answer", "is the answer", "are answers", "are the answers")
#: Words and signs after which the final value follows, tried in order.
VALUE_MARKERS = ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n")
#: The values of pi the ToRA grader tries when an answer contains ``\pi``.
PI_VALUES = (math.pi, 3.14)


def last_boxed_content(text: str) -> str | None:
    r"""What the last ``\boxed`` (else ``\fbox``) encloses, stripped; None when absent or unclosed.

    As verl reads it: from the marker, the first ``{`` opens and the brace that brings
    the depth back to zero closes (a ``}`` before any ``{`` counts too), which is
    :func:`~rewardq.reward.scoring.math_boxed.balanced_from`'s scan.
    """
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return None
    boxed = balanced_from(text, idx)
    return None if boxed is None else boxed[boxed.index("{") + 1 : -1].strip()


def _after_last(text: str, marker: str) -> str | None:
    # verl finds markers in text.lower() and cuts the original text at that index
    at = text.lower().rfind(marker)
    return None if at == -1 else text[at + len(marker) :].strip()


def match_answer(response: str) -> str:
    """The answer part of a response (see step 1 of the module doc)."""
    for marker in LEAD_MARKERS:
        cut = _after_last(response, marker)
        if cut is not None:
            response = cut
    for marker in TRAIL_MARKERS:
        at = response.lower().rfind(marker)
        if at != -1:
            response = response[:at].strip()
    boxed = last_boxed_content(response)
    if boxed:
        response = boxed
    if ". " in response:
        response = response[: response.lower().rfind(". ")].strip()
    for marker in VALUE_MARKERS:
        cut = _after_last(response, marker)
        if cut is not None:
            response = cut
    return response


def compute_score(solution_str: object, ground_truth: object) -> float:
    """1.0 when the answer in ``solution_str`` equals ``ground_truth``, else 0.0.

    Raises:
        ScoringError: called outside a process's main thread.
        MissingScorerExtra: the ``math`` extra is not installed.
    """
    require_main_thread("the numina (prime_math) scorer")
    prm800k = import_math_extra("rewardq.reward.scoring.prime_math.prm800k", "numina (prime_math)")
    from rewardq.reward.scoring.prime_math import tora

    response, truth = str(solution_str), str(ground_truth)
    answer = match_answer(response)
    if prm800k.grade_answer(answer, truth):
        return 1.0
    try:
        if "\\pi" in answer or "\\pi" in truth:
            # both values are tried before any() looks, as verl does: an error in either scores 0
            correct = any([tora.math_equal(answer, truth, pi=pi) for pi in PI_VALUES])
        else:
            correct = tora.math_equal(answer, truth)
    except Exception:  # noqa: BLE001 - verl scores any failure of the ToRA grader as wrong
        correct = False
    return 1.0 if correct else 0.0


def score(solution_str: object, ground_truth: object, **_: object) -> float:
    """:func:`compute_score` with the default scorer's signature (``extra_info`` and the rest ignored)."""
    return compute_score(solution_str, ground_truth)


place(score, "process")
