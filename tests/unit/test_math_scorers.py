r"""The ``numina_*`` (prime_math) and ``hiyouga/geometry3k`` (geo3k) scorers, without verl.

Known answers come from :mod:`tests.support.math_cases`, whose values tests/verl checks are
verl 0.9.1's own. Also: the time limit, the refusal to run off the main thread, the missing
``math`` extra, placement, and model text that must never run as code.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rewardq.errors import MissingScorerExtra, ScoringError
from rewardq.reward.scoring import default_compute_score, geo3k, placement_of, prime_math
from rewardq.reward.scoring.prime_math import arith, matrix, prm800k, tora
from rewardq.reward.scoring.time_limit import time_limit
from tests.support.math_cases import CASES, GEO3K, NUMINA_SOURCES, PMATRIX_12

# -- known answers ------------------------------------------------------------------------------


@pytest.mark.parametrize("data_source, solution, truth, expected", CASES)
def test_known_answers(data_source: str, solution: str, truth: Any, expected: Any) -> None:
    if isinstance(expected, type):
        with pytest.raises(expected):
            default_compute_score(data_source, solution, truth)
    else:
        score = default_compute_score(data_source, solution, truth)
        assert type(score) is float and score == expected


def test_every_numina_source_and_geometry3k_is_routed_to_a_process() -> None:
    for data_source in (*NUMINA_SOURCES, GEO3K):
        assert placement_of(data_source) == "process"
    assert placement_of("openai/gsm8k") == "inline"


def test_geometry3k_weights_accuracy_and_format() -> None:
    well_formed, right = r"<think>a</think> \boxed{7}", "7"
    assert geo3k.acc_reward(well_formed, right) == 1.0 and geo3k.format_reward(well_formed) == 1.0
    assert geo3k.compute_score(well_formed, right, format_score=0.5) == 1.0
    assert geo3k.compute_score(r"\boxed{7}", right, format_score=0.5) == 0.5
    assert geo3k.compute_score("7", right, use_boxed=False) == 0.9  # the whole text is the answer


@pytest.mark.parametrize(
    "response, answer",
    [
        (r"so the answer is $\boxed{\frac{1}{2}}$. Done", r"\frac{1}{2}"),
        ("Answer: 12", "12"),
        ("We get x = 4", "4"),
        ("5 is the answer", "5"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\fbox{3}", "3"),
        ("The result is 7. I hope that helps", "7"),
        (r"unclosed \boxed{5", r"unclosed \boxed{5"),
    ],
)
def test_answer_extraction(response: str, answer: str) -> None:
    assert prime_math.match_answer(response) == answer


def test_prm800k_normalisation() -> None:
    assert prm800k.normalize(r"\text{5 cm}") == "5"
    assert prm800k.normalize("3 million") == "3 *10^6"  # so "3 million" is not 3000000 (nor in verl)
    assert prm800k.normalize(r"\frac{1}{2}") == "1/2"
    assert prm800k.normalize("1,000") == "1000"
    assert prm800k.grade_answer("2/4", "1/2") is False  # an unreduced fraction is not the answer
    assert prm800k.grade_answer("(1, 2)", "[1, 2]") is False  # brackets matter


# -- time limits and threads --------------------------------------------------------------------


def test_time_limit_interrupts_python_code() -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="took longer than 0.2s"), time_limit(0.2, "the loop"):
        while True:
            pass
    assert time.monotonic() - t0 < 5


def test_time_limit_restores_an_outer_timer_and_handler() -> None:
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        with time_limit(0.5):
            pass
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25 < remaining <= 30  # the outer timer runs on
        with time_limit(60):  # an outer timer that fires sooner is left alone
            assert signal.getitimer(signal.ITIMER_REAL)[0] <= 30
        assert signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_sympy_comparison_past_its_limit_is_not_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    # 9999999! runs for minutes; the limit is verl's 10 s, shortened here
    monkeypatch.setattr(prm800k, "PRIME_MATH_SYMPY_TIMEOUT", 0.5)
    t0 = time.monotonic()
    assert default_compute_score("numina_olympiads", r"\boxed{9999999!}", r"\frac{1}{3}") == 0.0
    assert time.monotonic() - t0 < 8


def test_numina_refuses_to_run_off_the_main_thread() -> None:
    errors: list[BaseException] = []

    def score() -> None:
        try:
            default_compute_score("numina_olympiads", r"\boxed{1}", "1")
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    t = threading.Thread(target=score, name="not-main")
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], ScoringError)
    assert "main thread" in str(errors[0]) and "'not-main'" in str(errors[0])


# -- the math extra -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "missing, data_source, solution",
    [("pylatexenc", "numina_cn_k12", r"\boxed{1}"), ("mathruler", GEO3K, r"\boxed{1}")],
)
def test_a_missing_math_extra_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, missing: str, data_source: str, solution: str
) -> None:
    for name in list(sys.modules):
        if name == missing or name.startswith(missing + ".") or name.endswith("prime_math.prm800k"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)  # import now raises ModuleNotFoundError
    message = r"needs the '" + missing + r"' package.*pip install 'rewardq\[math\]'"
    with pytest.raises(MissingScorerExtra, match=message):
        default_compute_score(data_source, solution, "1")


# -- model text never runs as code --------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["2*3.14", "1*3.141592653589793/2", "(6.28, 3)", "[1, [2, 3]]", "-2**-1", "{1, 2}", "1 < 2 < 3", " 1+1"]
)
def test_arithmetic_evaluates_as_eval_does(text: str) -> None:
    assert repr(arith.evaluate(text)) == repr(eval(text, {"__builtins__": {}}))


@pytest.mark.parametrize(
    "text", ["__import__('os').getpid()", "abs(-1)", "(1).real", "[1][0]", "x", "9**9**9", "[0]*10**12", "1<<10**9"]
)
def test_arithmetic_refuses_code_and_huge_results(text: str) -> None:
    with pytest.raises(ValueError):
        arith.evaluate(text)


def test_model_text_cannot_run_code(tmp_path: Path) -> None:
    canary = tmp_path / "ran"
    payload = f"__import__('pathlib').Path({str(canary)!r}).touch()"
    responses = [
        (r"\boxed{" + payload + r"\pi}", "3"),  # verl eval()s text containing \pi
        (r"\boxed{[" + payload + "]}", PMATRIX_12),  # and [...] answers compared with a matrix
        (r"\boxed{Matrix([" + payload + "])}", PMATRIX_12),  # and hands Matrix(...) to sympy's parser
    ]
    for response, truth in responses:
        assert default_compute_score("numina_olympiads", response, truth) == 0.0
    assert not canary.exists()


def test_matrix_answers_are_parsed_only_when_plain() -> None:
    assert list(matrix.parse_matrix("Matrix([[1], [sqrt(2)]])")) == list(matrix.parse_matrix("Matrix([1, sqrt(2)])"))
    for text in ["Matrix([1]).T", "Matrix([[1]*10**9])", "Matrix(S('x'))", "Matrix([x**100000])", "Matrix(a=1)"]:
        with pytest.raises(ValueError):
            matrix.check_plain(text)
    assert tora.math_equal("Matrix([[1], [2]])", PMATRIX_12) is True
