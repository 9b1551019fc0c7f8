"""GSM8K scoring: the ``#### <answer>`` convention, exactly as verl scores it.

A GSM8K solution ends with a line ``#### 72``. The scorer looks only at the last
300 characters of the response (the final answer is at the end, and regexes over a
whole long response are slow), takes the **last** ``#### <number>`` there, drops
thousands separators, and compares the string with the ground truth::

    >>> compute_score("She has 3 + 4 = 7 apples.\\n#### 7", "7")
    1.0
    >>> compute_score("#### 1,234", "1234")
    1.0
    >>> compute_score("The answer is 7.", "7")   # strict mode needs the marker
    0.0
    >>> compute_score("The answer is 7.", "7", method="flexible")
    1.0

The comparison is plain string equality: ``"7.0"`` does not equal ``"7"``.
"""

from __future__ import annotations

import re

#: Only this many trailing characters of the response are searched (verl's clip).
SOLUTION_CLIP_CHARS = 300

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
_INVALID = ("", ".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string a response commits to, or None when there is none.

    Args:
        solution_str: the decoded response.
        method: ``"strict"`` takes the last ``#### <number>`` and removes ``,`` and
            ``$``; ``"flexible"`` takes the last run of digits/dots/commas that is not
            just ``"."`` (kept as written, commas included, as verl does).
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    if len(solution_str) > SOLUTION_CLIP_CHARS:
        solution_str = solution_str[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        found: list[str] = _STRICT.findall(solution_str)
        if not found:
            return None
        return found[-1].replace(",", "").replace("$", "")
    candidates: list[str] = _FLEXIBLE.findall(solution_str)
    if not candidates:
        return None
    for candidate in reversed(candidates):
        if candidate not in _INVALID:
            return candidate
    # Every candidate was a lone ".": verl's loop then leaves the first one in hand,
    # which can never equal a numeric ground truth and so scores ``format_score``.
    return candidates[0]


def compute_score(
    solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """GSM8K reward: ``score`` when the extracted answer equals ``ground_truth``.

    Returns 0.0 when no answer is found, ``format_score`` when an answer is found but
    differs from the ground truth, ``score`` when it matches exactly.
    """
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answer == ground_truth else float(format_score)
