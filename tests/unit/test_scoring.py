"""Default scorers: exact numbers, matching verl's reward_score modules."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from rewardq.errors import ScoringError, UnknownDataSourceError
from rewardq.reward.scoring import (
    dapo_math,
    default_compute_score,
    gsm8k,
    known_data_sources,
    math_boxed,
    math_verify_scorer,
    search_r1,
)

# --------------------------------------------------------------------------------------
# GSM8K
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, gt, expected",
    [
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", 1.0),  # correct
        ("Natalia sold 48 + 24 = 71 clips.\n#### 71", "72", 0.0),  # wrong -> format_score 0.0
        ("Natalia sold 72 clips in all.", "72", 0.0),  # no "####"
        ("The total is #### 1,234", "1234", 1.0),  # thousands separator removed
        ("#### -5", "-5", 1.0),  # negative
        ("#### 3\nwait, actually\n#### 4", "4", 1.0),  # last match wins
        ("#### 3\nwait, actually\n#### 4", "3", 0.0),
        ("#### $1,234", "1234", 0.0),  # "$" before the digits: no match
        ("#### 7.0", "7", 0.0),  # string equality, not numeric
        ("####72", "72", 0.0),  # the space is required
    ],
)
def test_gsm8k_strict(text: str, gt: str, expected: float) -> None:
    assert gsm8k.compute_score(text, gt) == expected


def test_gsm8k_only_last_300_characters_are_read() -> None:
    answer = "#### 72"
    filler = "x" * 300
    assert gsm8k.compute_score(answer + filler, "72") == 0.0  # answer outside the window
    assert gsm8k.compute_score(filler + answer, "72") == 1.0  # inside
    # the window is exactly 300 characters: "#### 72" starting at -300 is still seen ...
    assert gsm8k.compute_score(answer + "x" * 293, "72") == 1.0
    # ... one more character pushes its "#" out, and the marker no longer matches
    assert gsm8k.compute_score(answer + "x" * 294, "72") == 0.0


def test_gsm8k_format_score_and_score() -> None:
    assert gsm8k.compute_score("#### 5", "6", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no answer", "6", format_score=0.1) == 0.0  # no answer at all: 0
    assert gsm8k.compute_score("#### 6", "6", score=2.0) == 2.0


def test_gsm8k_flexible() -> None:
    assert gsm8k.compute_score("so she has 72 clips.", "72", method="flexible") == 1.0
    assert gsm8k.compute_score("so she has 72 clips. Done.", "72", method="flexible") == 1.0  # "." skipped
    assert gsm8k.compute_score("1,234", "1234", method="flexible") == 0.0  # flexible keeps commas
    assert gsm8k.extract_solution("between 3 and 4", "flexible") == "4"
    assert gsm8k.extract_solution("nothing numeric", "flexible") is None
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", method="loose")


def test_gsm8k_returns_plain_float() -> None:
    assert type(gsm8k.compute_score("#### 1", "1")) is float
    assert type(gsm8k.compute_score("none", "1")) is float


# --------------------------------------------------------------------------------------
# MATH (boxed)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, gt, expected",
    [
        (r"The answer is $\boxed{5}$.", "5", 1.0),
        (r"The answer is $\boxed{5}$.", "6", 0.0),
        (r"The answer is 5.", "5", 0.0),  # no box
        (r"so $\boxed{\dfrac{1}{2}}$", r"\frac12", 1.0),  # dfrac, shorthand frac
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),  # 0.5 -> \frac{1}{2}
        (r"\boxed{1/2}", r"\frac{1}{2}", 1.0),  # a/b -> \frac{a}{b}
        (r"\boxed{0.25}", r"\frac{1}{4}", 0.0),  # string equality only
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", 1.0),  # nested braces, sqrt3
        (r"first \boxed{1} then \boxed{2}", "2", 1.0),  # last box wins
        (r"first \boxed{1} then \boxed{2}", "1", 0.0),
        (r"\boxed{10\text{ cm}}", "10", 1.0),  # units dropped
        (r"\boxed{90^\circ}", "90", 1.0),  # degrees dropped
        (r"\boxed{k = 3}", "3", 1.0),  # short lhs dropped
        (r"\boxed{\left( 1, 2 \right)}", "(1,2)", 1.0),
        (r"\boxed{.5}", r"\frac12", 1.0),
        (r"\boxed 7$ done", "7", 1.0),  # "\boxed x" form
        (r"\fbox{7}", "7", 1.0),  # \fbox (verl scores 0 here)
        (r"\boxed{5", "5", 0.0),  # unbalanced
    ],
)
def test_math_boxed(text: str, gt: str, expected: float) -> None:
    assert math_boxed.compute_score(text, gt) == expected


def test_math_boxed_helpers() -> None:
    assert math_boxed.last_boxed_only_string(r"a \boxed{\frac{1}{2}} b") == r"\boxed{\frac{1}{2}}"
    assert math_boxed.last_boxed_only_string("nothing") is None
    assert math_boxed.strip_string(r"\dfrac12") == r"\frac{1}{2}"
    assert math_boxed.strip_string("3/4") == r"\frac{3}{4}"
    assert math_boxed.is_equiv(None, None) is True
    assert math_boxed.is_equiv("1", None) is False


# --------------------------------------------------------------------------------------
# DAPO math
# --------------------------------------------------------------------------------------


def test_dapo_correct_and_wrong() -> None:
    assert dapo_math.compute_score("2 + 2 = 4.\nAnswer: 4", "4") == {"score": 1.0, "acc": True, "pred": "4"}
    assert dapo_math.compute_score("2 + 2 = 5.\nAnswer: 5", "4") == {"score": -1.0, "acc": False, "pred": "5"}


def test_dapo_answer_line_rules() -> None:
    # case-insensitive, last "Answer:" wins, normalised ($, thousands separators, units, "x =")
    assert dapo_math.compute_score("answer: 3\nANSWER : 7", "7")["score"] == 1.0
    assert dapo_math.compute_score("Answer: $1,000$ dollars", "1000") == {"score": 1.0, "acc": True, "pred": "1000"}
    assert dapo_math.compute_score(r"Answer: x = \frac{1}{2}", r"\frac{1}{2}")["acc"] is True
    assert dapo_math.compute_score(r"Answer: \text{(B)}", "(B)")["score"] == 1.0


def test_dapo_boxed_fallback() -> None:
    # no "Answer:" line: the last \boxed{} of the last 100 characters, normalised
    assert dapo_math.compute_score(r"so it is \boxed{42}.", "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert dapo_math.compute_score(r"so it is \boxed{41}.", "42") == {"score": -1.0, "acc": False, "pred": "41"}
    # the box must be within the last 100 characters
    far = r"\boxed{42}" + " " * 100
    assert dapo_math.compute_score(far, "42") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    # an "Answer:" line beats a box
    assert dapo_math.compute_score("\\boxed{42}\nAnswer: 41", "42")["pred"] == "41"


def test_dapo_no_answer_and_window() -> None:
    assert dapo_math.compute_score("I give up", "4") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    # only the last 300 characters are read
    assert dapo_math.compute_score("Answer: 4\n" + "z" * 300, "4")["pred"] == "[INVALID]"
    assert dapo_math.compute_score("z" * 300 + "\nAnswer: 4", "4")["score"] == 1.0


def test_dapo_strict_box_mode() -> None:
    assert dapo_math.compute_score(r"\boxed{4}", "4", strict_box_verify=True) == {
        "score": 1.0,
        "acc": True,
        "pred": "4",
    }
    # strict mode compares the raw box content: no normalisation
    assert dapo_math.compute_score(r"\boxed{ 4}", "4", strict_box_verify=True)["score"] == -1.0
    assert dapo_math.compute_score("Answer: 4", "4", strict_box_verify=True) == {
        "score": -1.0,
        "acc": False,
        "pred": None,
    }


# --------------------------------------------------------------------------------------
# Search-R1
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, target, expected",
    [
        ("<think>hm</think><answer>Paris</answer>", "Paris", 1.0),
        ("<answer>The Eiffel Tower!</answer>", ["eiffel tower", "Tour Eiffel"], 1.0),  # articles, punctuation
        ("<answer>  paris  </answer>", ["PARIS"], 1.0),
        ("<answer>Lyon</answer>", ["Paris", "City of Light"], 0.0),
        ("Paris", ["Paris"], 0.0),  # no tag
        ("<answer>Lyon</answer> no, <answer>Paris</answer>", ["Paris"], 1.0),  # last tag
        ("<answer>Paris</answer> no, <answer>Lyon</answer>", ["Paris"], 0.0),
        ("<answer>Paris, France</answer>", ["Paris"], 0.0),  # exact, not substring
        ("<answer>\nNew\nYork\n</answer>", ["new york"], 1.0),  # multi-line
    ],
)
def test_search_r1_em(text: str, target: list[str] | str, expected: float) -> None:
    assert search_r1.compute_score(text, {"target": target}) == expected


def test_search_r1_tag_spam_quartered() -> None:
    spam = "<answer>x</answer>" * 11 + "<answer>Paris</answer>"
    assert search_r1.compute_score(spam, {"target": ["Paris"]}) == 0.25
    ok = "<answer>x</answer>" * 9 + "<answer>Paris</answer>"
    assert search_r1.compute_score(ok, {"target": ["Paris"]}) == 1.0


def test_search_r1_bad_ground_truth_is_a_clear_error() -> None:
    with pytest.raises(ScoringError, match="target"):
        search_r1.compute_score("<answer>Paris</answer>", "Paris")  # type: ignore[arg-type]  # the bad ground truth is the test
    assert search_r1.compute_score_subem("<answer>Paris, France</answer>", {"target": "paris"}) == 1.0


# --------------------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data_source, text, gt, expected",
    [
        ("openai/gsm8k", "#### 18", "18", 1.0),
        ("lighteval/MATH", r"\boxed{18}", "18", 1.0),
        ("DigitalLearningGmbH/MATH-lighteval", r"\boxed{17}", "18", 0.0),
        ("HuggingFaceH4/MATH-500", r"\boxed{\frac12}", "0.5", 1.0),
        ("math_dapo", "Answer: 18", "18", {"score": 1.0, "acc": True, "pred": "18"}),
        ("math", "Answer: 17", "18", {"score": -1.0, "acc": False, "pred": "17"}),
        ("math_dapo_reasoning", r"\boxed{18}", "18", {"score": 1.0, "acc": True, "pred": "18"}),
        ("aime2024", "Answer: 18", "18", {"score": 1.0, "acc": True, "pred": "18"}),
        ("aime_2025_ii", "Answer: 18", "19", {"score": -1.0, "acc": False, "pred": "18"}),
        ("searchR1_nq", "<answer>Paris</answer>", {"target": ["Paris"]}, 1.0),
        ("searchR1_bamboogle", "<answer>Lyon</answer>", {"target": ["Paris"]}, 0.0),
    ],
)
def test_default_compute_score_dispatch(
    data_source: str, text: str, gt: dict[str, list[str]] | str, expected: dict[str, float | str] | float
) -> None:
    result = default_compute_score(data_source, text, gt, extra_info={"split": "test"})
    assert result == expected
    if not isinstance(expected, dict):
        assert type(result) is float


def test_default_compute_score_gsm8k_flexible_keyword() -> None:
    assert default_compute_score("openai/gsm8k", "it is 18", "18") == 0.0
    assert default_compute_score("openai/gsm8k", "it is 18", "18", method="flexible") == 1.0
    # keywords meant for other scorers (verl's sandbox settings) are accepted and ignored
    assert default_compute_score("lighteval/MATH", r"\boxed{1}", "1", sandbox_fusion_url=None) == 1.0


@pytest.mark.parametrize("data_source", ["my/dataset", "searchR1_unknown", "GSM8K", None, 3])
def test_unknown_data_source_names_it_and_says_how_to_plug_in(data_source: int | str | None) -> None:
    with pytest.raises(UnknownDataSourceError) as info:
        default_compute_score(data_source, "x", "y")
    message = str(info.value)
    assert repr(data_source) in message
    assert "--reward-fn FILE_OR_MODULE:FUNC" in message
    assert "openai/gsm8k" in message and "aime*" in message


def test_known_data_sources_lists_the_table() -> None:
    known = known_data_sources()
    assert "openai/gsm8k" in known and "searchR1_2wikimultihopqa" in known and "aime*" in known
    assert "numina_olympiads" in known and "hiyouga/geometry3k" in known
    assert {"codecontests", "apps", "codeforces", "taco"} <= set(known)
    assert len(known) == 26


# --------------------------------------------------------------------------------------
# math-verify (processes only)
# --------------------------------------------------------------------------------------

MATH_VERIFY_CASES = [
    (r"so the answer is \boxed{1/2}", "0.5", 1.0),
    (r"so the answer is \boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"so the answer is \boxed{1/3}", "0.5", 0.0),
    (r"The result is $x = 2\sqrt{2}$", r"\sqrt{8}", 1.0),
    ("no idea", "0.5", 0.0),
]


def _score_case(case: tuple[str, str, Any]) -> Any:
    text, gt, _ = case
    return math_verify_scorer.compute_score("math-verify", text, gt)


def test_math_verify_refuses_threads_instead_of_scoring_zero() -> None:
    errors = []

    def target() -> None:
        try:
            math_verify_scorer.compute_score("x", r"\boxed{1/2}", "0.5")
        except ScoringError as exc:
            errors.append(exc)

    t = threading.Thread(target=target, name="scorer-thread")
    t.start()
    t.join()
    assert len(errors) == 1
    assert "scorer-thread" in str(errors[0]) and "signal.alarm" in str(errors[0])
