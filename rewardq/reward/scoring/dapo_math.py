r"""DAPO math scoring: ``Answer: ...`` (Minerva style), falling back to ``\boxed{}``.

Used for ``math_dapo``, ``math``, ``math_dapo_reasoning`` and every ``aime*`` data
source, exactly as verl's ``math_dapo.py`` scores them:

1. keep only the last 300 characters of the response;
2. take the last line matching ``Answer: <text>`` (case-insensitive) and normalise it
   with :func:`normalize_final_answer` (keep what follows the last ``=``, drop units,
   ``\text{}``, ``$``, spaces, thousands separators, ...);
3. if there is no such line, take the last ``\boxed{...}`` in the **last 100**
   characters of that window and normalise it the same way;
4. compare with the normalised ground truth.

The result is a dict: ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}``; ``pred``
is ``"[INVALID]"`` when the response commits to no answer::

    >>> compute_score("... so 2 + 2 = 4.\nAnswer: 4", "4")
    {'score': 1.0, 'acc': True, 'pred': '4'}
    >>> compute_score("I think \\boxed{5}", "4")
    {'score': -1.0, 'acc': False, 'pred': '5'}

With ``strict_box_verify=True`` only the last ``\boxed{}`` of the last 100 characters
counts, compared **without** normalisation, and ``pred`` is None when there is no box.
"""

from __future__ import annotations

import re

from rewardq.reward.scoring.math_boxed import balanced_from

INVALID = "[INVALID]"
#: Only this many trailing characters are looked at (MATH-500's longest answer has 159).
SOLUTION_CLIP_CHARS = 300
#: The boxed fallback and strict-box mode look at this many trailing characters.
BOX_WINDOW_CHARS = 100
ANSWER_PATTERN = r"(?i)Answer\s*:\s*([^\n]+)"

SUBSTITUTIONS = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
]
REMOVED_EXPRESSIONS = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
]


def last_boxed_only_string(string: str) -> str | None:
    r"""The last ``\boxed{...}`` with balanced braces, or None."""
    idx = string.rfind("\\boxed{")
    return None if idx < 0 else balanced_from(string, idx)


def remove_boxed(s: str) -> str:
    r"""The content of ``\boxed{...}``."""
    left = "\\boxed{"
    if not (s.startswith(left) and s.endswith("}")):
        raise ValueError(f"not a boxed expression: {s[:80]!r}")
    return s[len(left) : -1]


def normalize_final_answer(final_answer: str) -> str:
    """Normalise a final answer (Minerva / lm-eval rules, in verl's order)."""
    final_answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
    # shorthand TeX: \fracab -> \frac{a}{b}, \sqrta -> \sqrt{a}
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer.strip()


def is_correct_minerva(
    solution_str: str, gt: str, gt_need_extract: bool = False, answer_pattern: str = ANSWER_PATTERN
) -> tuple[bool, str]:
    """``(correct, normalised prediction)`` from the last ``Answer:`` line."""
    match = re.findall(answer_pattern, solution_str)
    pred = normalize_final_answer(match[-1] if match else INVALID)
    if gt_need_extract:
        boxed = last_boxed_only_string(gt)
        if boxed is None:
            raise ValueError(f"ground truth has no \\boxed{{}} to extract: {gt[:80]!r}")
        gt = normalize_final_answer(remove_boxed(boxed))
    else:
        gt = normalize_final_answer(gt)
    return pred == gt, pred


def is_correct_strict_box(pred: str, gt: str, pause_tokens_index: list[int] | None = None) -> tuple[int, str | None]:
    """``(1 or -1, boxed content or None)`` from the last box of the last 100 characters."""
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index must have 4 entries, got {len(pause_tokens_index)}")
        pred = pred[pause_tokens_index[-1] - BOX_WINDOW_CHARS :]
    else:
        pred = pred[-BOX_WINDOW_CHARS:]
    boxed = last_boxed_only_string(pred)
    extracted = remove_boxed(boxed) if boxed is not None else None
    return (1 if extracted == gt else -1), extracted


def verify(
    solution_str: str, answer: str, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> tuple[bool, str | None]:
    """``(correct, pred)``: Minerva first, then the boxed fallback (unless strict-box mode)."""
    if strict_box_verify:
        correct, pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return correct == 1, pred
    correct, pred = is_correct_minerva(solution_str, answer)
    if pred != INVALID:
        return correct, pred
    _, box_pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
    if box_pred is not None:
        box_pred = normalize_final_answer(box_pred)
        return box_pred == normalize_final_answer(answer), box_pred
    return correct, pred


def compute_score(
    solution_str: str, ground_truth: str, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> dict[str, object]:
    """``{"score": 1.0 | -1.0, "acc": bool, "pred": str | None}`` (see the module docstring)."""
    solution_str = solution_str[-SOLUTION_CLIP_CHARS:]
    correct, pred = verify(solution_str, ground_truth, strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred}
