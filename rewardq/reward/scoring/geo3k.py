r"""The ``hiyouga/geometry3k`` scorer: verl's ``geo3k``, accuracy of the last ``\boxed{}`` plus a format bonus.

``score = 0.9 * acc + 0.1 * format``, as verl 0.9.1 computes it:

* ``acc`` is 1.0 when mathruler's grader (the PRM800K grader: normalisation, then sympy)
  says the content of the last ``\boxed{...}`` equals the ground truth. Without a box
  the answer is the text ``"None"``.
* ``format`` is 1.0 when the whole response has the shape
  ``<think>...</think>...\boxed{...}...``.

So a right, well-formed response scores 1.0, a right answer without the ``<think>``
block 0.9, a wrong but well-formed one 0.1, anything else 0.0::

    >>> compute_score(r"<think>3 + 4</think> The answer is \boxed{7}", "7")
    1.0

It uses mathruler itself (the ``math`` extra), as verl does. mathruler puts no time
limit on sympy, and neither does verl; the scorer has ``placement = "process"`` so a
slow sample runs in a scorer process, whose own timeout bounds it (``remote``: killed and
scored 0.0 with ``timeout: True``).
"""

from __future__ import annotations

import re

from rewardq.reward.scoring.math_extra import import_math_extra
from rewardq.reward.scoring.placement import place

__all__ = ["compute_score", "score", "format_reward", "acc_reward"]

FORMAT_PATTERN = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
#: Weight of the format bonus in the score (verl's default).
FORMAT_SCORE = 0.1


def format_reward(predict_str: str) -> float:
    r"""1.0 when the response reads ``<think>...</think>...\boxed{...}...``, else 0.0."""
    return 1.0 if FORMAT_PATTERN.fullmatch(predict_str) else 0.0


def acc_reward(predict_str: str, ground_truth: object, use_boxed: bool = True) -> float:
    """1.0 when mathruler grades the (boxed) answer equal to ``ground_truth``, else 0.0.

    Raises:
        MissingScorerExtra: mathruler (the ``math`` extra) is not installed.
    """
    grader = import_math_extra("mathruler.grader", "hiyouga/geometry3k (geo3k)")
    answer = grader.extract_boxed_content(predict_str) if use_boxed else predict_str
    return 1.0 if grader.grade_answer(answer, ground_truth) else 0.0


def compute_score(
    predict_str: str, ground_truth: object, use_boxed: bool = True, format_score: float = FORMAT_SCORE
) -> float:
    """``(1 - format_score) * acc + format_score * format`` (see the module doc)."""
    return (1.0 - format_score) * acc_reward(predict_str, ground_truth, use_boxed) + format_score * format_reward(
        predict_str
    )


def score(solution_str: str, ground_truth: object, **_: object) -> float:
    """:func:`compute_score` with the default scorer's signature (``extra_info`` and the rest ignored)."""
    return compute_score(solution_str, ground_truth)


place(score, "process")
