"""Search-R1 QA scoring: exact match of the last ``<answer>...</answer>``.

For the ``searchR1_*`` data sources (nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa,
musique, bamboogle), as verl's ``search_r1_like_qa_em.py``: the text inside the last
``<answer>`` tag is normalised (lower case, punctuation and the articles a/an/the
removed, whitespace collapsed) and compared with each acceptable answer in
``ground_truth["target"]`` (a string or a list of strings)::

    >>> compute_score("<think>...</think><answer>The Eiffel Tower</answer>",
    ...               {"target": ["eiffel tower", "Tour Eiffel"]})
    1.0

No ``<answer>`` tag gives 0.0; a wrong answer gives ``format_score`` (0.0); a right
one gives ``score`` (1.0), cut to a quarter when the response spams more than ten
opening or closing answer tags.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable
from typing import Any

from rewardq.errors import ScoringError

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
#: More answer tags than this marks the response as tag spam (reward divided by 4).
MAX_ANSWER_TAGS = 10


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop articles, collapse whitespace (SQuAD rules)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _as_list(golden_answers: str | Iterable[str]) -> Iterable[str]:
    if isinstance(golden_answers, str):
        return [golden_answers]
    return golden_answers


def em_check(prediction: str, golden_answers: Any) -> bool:
    """True when the normalised prediction equals any normalised golden answer."""
    pred = normalize_answer(prediction)
    return any(normalize_answer(g) == pred for g in _as_list(golden_answers))


def subem_check(prediction: str, golden_answers: Any) -> bool:
    """True when any normalised golden answer is a substring of the normalised prediction."""
    pred = normalize_answer(prediction)
    return any(normalize_answer(g) in pred for g in _as_list(golden_answers))


def extract_solution(solution_str: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>``, or None."""
    matches = _ANSWER.findall(solution_str)
    return matches[-1].strip() if matches else None


def _targets(ground_truth: object) -> object:
    if not isinstance(ground_truth, dict) or "target" not in ground_truth:
        raise ScoringError(
            "Search-R1 scoring needs reward_model.ground_truth = {'target': <answer or list of "
            f"answers>}}, got {type(ground_truth).__name__} {ground_truth!r:.80}"
        )
    return ground_truth["target"]


def _matched(solution_str: str, ground_truth: object, check: Callable[[str, object], object]) -> bool | None:
    """None when the solution has no answer tag, else whether ``check(answer, targets)`` holds."""
    targets = _targets(ground_truth)
    answer = extract_solution(solution_str)
    return None if answer is None else bool(check(answer, targets))


def compute_score(
    solution_str: str,
    ground_truth: dict[str, object],
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Exact-match reward (see the module docstring). ``method`` is accepted and ignored, as in verl."""
    matched = _matched(solution_str, ground_truth, em_check)
    if matched is None:
        return 0.0
    if not matched:
        return float(format_score)
    if solution_str.count("<answer>") > MAX_ANSWER_TAGS or solution_str.count("</answer>") > MAX_ANSWER_TAGS:
        return float(score) / 4
    return float(score)


def compute_score_subem(
    solution_str: str,
    ground_truth: dict[str, object],
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Substring-match variant: a golden answer contained in the extracted answer counts."""
    matched = _matched(solution_str, ground_truth, subem_check)
    if matched is None:
        return 0.0
    return float(score) if matched else float(format_score)
