r"""rewardq's ``numina_*`` and ``hiyouga/geometry3k`` scorers give verl 0.9.1's scores.

Given the same ``(data_source, solution_str, ground_truth)``, rewardq's
``default_compute_score`` and verl's ``verl.utils.reward_score.default_compute_score``
return the same value of the same type, or raise the same exception type:

* on the known-answer table of :mod:`tests.support.math_cases` (right, wrong, equivalent
  forms, units, latex spacing, malformed, no ``\boxed``, a sympy timeout), whose expected
  values must also still be verl's own;
* on a few hundred seeded combinations of answer forms and response shapes, compared at
  the level of the score and of each grader step (answer extraction, both graders).
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import pytest
import verl
from verl.utils.reward_score import default_compute_score as verl_score
from verl.utils.reward_score import prime_math as verl_prime
from verl.utils.reward_score.prime_math import grader as verl_grader

from rewardq.reward.scoring import default_compute_score
from rewardq.reward.scoring import prime_math as ours_prime
from rewardq.reward.scoring.prime_math import prm800k, tora
from tests.support.math_cases import CASES, GEO3K, NUMINA_SOURCES, PMATRIX_12, SLOW_CASES


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """``("value", (type, value))`` or ``("raises", exception type)``."""
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the exception type is what is compared
        return ("raises", type(exc))
    return ("value", (type(value), value))


def expected_outcome(expected: Any) -> tuple[str, Any]:
    if isinstance(expected, type) and issubclass(expected, BaseException):
        return ("raises", expected)
    return ("value", (float, expected))


def test_the_reference_is_verl_0_9_1() -> None:
    assert verl.__version__ == "0.9.1"


@pytest.mark.parametrize("data_source, solution, truth, expected", CASES)
def test_known_answers_are_verls_and_ours(data_source: str, solution: str, truth: Any, expected: Any) -> None:
    theirs = outcome(verl_score, data_source, solution, truth)
    assert theirs == expected_outcome(expected), "verl no longer gives the table's value"
    assert outcome(default_compute_score, data_source, solution, truth) == theirs


@pytest.mark.parametrize("data_source, solution, truth, expected", SLOW_CASES)
def test_a_sympy_timeout_gives_verls_score_after_verls_limit(
    data_source: str, solution: str, truth: Any, expected: Any
) -> None:
    t0 = time.monotonic()
    theirs = verl_score(data_source, solution, truth)
    verl_seconds = time.monotonic() - t0
    t0 = time.monotonic()
    ours = default_compute_score(data_source, solution, truth)
    our_seconds = time.monotonic() - t0
    assert theirs == ours == expected
    # both gave up at their 10 s limit (the computation itself runs far longer)
    assert 9 < verl_seconds < 40 and 9 < our_seconds < 40, (verl_seconds, our_seconds)


# -- seeded combinations ----------------------------------------------------------------------

ATOMS = [
    "1", "2", "0.5", "1/2", r"\frac{1}{2}", r"\dfrac12", r"\frac{2}{4}", "3.14", r"\pi", r"2\pi",
    r"\frac{\pi}{2}", "x", "x+1", "1+x", "2x", "x^2", r"\sqrt{2}", r"\sqrt2", "1.4142", "(1,2)", "[1,2]",
    "(1, 2]", "1,000", "1000", "10%", "0.1", r"10\%", "$5", "5", "5.0", "-3", "- 3", r"\text{cm}", "5 cm",
    r"5\text{ cm}", "12_3", "x_1", r"\infty", r"(-\infty, 3)", "Interval(0, 1)", "[0, 1]", "Point(1, 2)",
    "Matrix([[1], [2]])", "[[1],[2]]", PMATRIX_12, r"\begin{pmatrix}1\\2\end{pmatrix}", "{1, 2}", "2, 3",
    "3, 2", "a", "A", r"\text{(A)}", "yes", "", " ", "}", "{", "1e3", "inf", "nan", "7 3/4", r"7\frac{3}{4}",
    "31/4", "2 and 3", "2 or 3", r"90^\circ", "90", r"\$5", "3 million", "3000000", "1010_2", "(1,2,3)",
    r"2\pi/3", r"\pi/2", "1.5707963", "[1, 2, 3]", "x=3", "k = 3", r"\{1,2\}", r"\left(1,2\right)",
    r"(2\pi, 3)", r"[2\pi, 3]", "0", "False", "[]", "()",
]  # fmt: skip
RESPONSES = [
    "{a}", r"\boxed{{{a}}}", "The answer is {a}.", "so x = {a}", "Answer: {a}", "{a} is the answer",
    r"$\boxed{{{a}}}$. Done", "We get {a}", r"\fbox{{{a}}}", r"Thus: \boxed{{{a}}}. So answer is {a}",
    r"<think>work</think> \boxed{{{a}}}", r"<think>work</think> {a}",
]  # fmt: skip


def combinations(seed: int, n: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(rng.choice(RESPONSES).format(a=rng.choice(ATOMS)), rng.choice(ATOMS)) for _ in range(n)]


def test_seeded_combinations_score_the_same() -> None:
    mismatches: list[tuple[object, ...]] = []
    for i, (response, truth) in enumerate(combinations(seed=13, n=240)):
        data_source = GEO3K if i % 4 == 0 else NUMINA_SOURCES[i % len(NUMINA_SOURCES)]
        theirs = outcome(verl_score, data_source, response, truth)
        if outcome(default_compute_score, data_source, response, truth) != theirs:
            mismatches.append((data_source, response, truth, theirs))
    assert mismatches == []


def test_seeded_combinations_grade_the_same_step_by_step() -> None:
    mismatches: list[tuple[object, ...]] = []
    for response, truth in combinations(seed=29, n=400):
        if verl_prime.match_answer(response)[1] != ours_prime.match_answer(response):
            mismatches.append(("match_answer", response))
        answer = ours_prime.match_answer(response)
        for pi in (math.pi, 3.14):
            theirs = outcome(verl_grader.math_equal, answer, truth, timeout=True, pi=pi)
            ours = outcome(tora.math_equal, answer, truth, pi=pi)
            if theirs[0] != ours[0] or (theirs[0] == "value" and bool(theirs[1][1]) != bool(ours[1][1])):
                mismatches.append(("math_equal", answer, truth, pi, theirs, ours))
    for response, truth in combinations(seed=31, n=80):
        answer = ours_prime.match_answer(response)
        if outcome(verl_prime.grade_answer, answer, truth) != outcome(prm800k.grade_answer, answer, truth):
            mismatches.append(("grade_answer", answer, truth))
    assert mismatches == []
