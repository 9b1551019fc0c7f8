r"""The ToRA answer grader, as verl's ``prime_math`` runs it after the PRM800K grader said no.

:func:`math_equal` says True, in this order, when

1. the texts are equal ignoring case and outer blanks, or ignoring every space;
2. both read as numbers (``1,000`` and ``1{,}000`` too) and the prediction is within a
   relative 1e-4 of the reference, or of the reference x100 or /100 (percentages);
3. they are equal once ``[]()`` around them and every ``{}()`` inside are dropped;
4. both are intervals or tuples with the same brackets and equal parts, or both contain
   commas and every part is equal (same number of parts; here a mismatch is final);
5. a ``Point(...)`` prediction equals a ``(...)`` reference part by part;
6. a ``Matrix(...)`` (read by :mod:`.matrix`) or ``[[...]]`` prediction equals a
   ``\begin{pmatrix}`` reference entry by entry.

Before that each side is read: ``$12`` and ``12%`` lose their sign, ``1010_2`` becomes
the integer before the ``_`` (text such as ``x_1`` raises, which the caller scores as
wrong), and ``\pi`` becomes ``*pi`` / ``1*pi`` and the result is evaluated as arithmetic
(:mod:`.arith`; it stays text when it is not arithmetic).

Exceptions propagate exactly where verl's do (a part of an interval that raises aborts the
whole comparison), because the caller scores any exception as wrong and a nested
comparison that raised differs from one that said False.
"""

from __future__ import annotations

import math
import re
from math import isclose

from rewardq.reward.scoring.prime_math import arith
from rewardq.reward.scoring.prime_math.matrix import parse_matrix

__all__ = ["math_equal", "read_answer"]

_DOLLAR_AMOUNT = re.compile(r"\$\d+(\.\d+)?")
_PERCENTAGES = (re.compile(r"^\d+(\.\d+)?%$"), re.compile(r"^\d+(\.\d+)?\\%$"))
_INTERVALS = (
    (re.compile(r"^Interval\((.*)\)$"), "[", "]"),
    (re.compile(r"^Interval\.Ropen\((.*)\)$"), "[", ")"),
    (re.compile(r"^Interval\.Lopen\((.*)\)$"), "(", "]"),
    (re.compile(r"^Interval\.open\((.*)\)$"), "(", ")"),
)
PMATRIX = r"\begin{pmatrix}"
#: ``prediction`` is cut to this many characters before it is compared.
MAX_PREDICTION_CHARS = 1000


def _as_number(value: object) -> tuple[bool, float | None]:
    text = str(value)
    try:
        if "{,}" in text:
            return True, float(text.replace("{,}", ""))
        return True, float(text.replace(",", ""))
    except ValueError:
        return False, None


def _substitute_pi(text: str, pi: float) -> object:
    at = text.find("\\pi")
    while at != -1:
        factor = f"*{pi}" if at > 0 and text[at - 1].isdigit() else f"1*{pi}"
        text = text[:at] + factor + text[at + 3 :]
        at = text.find("\\pi", at + 1)
    try:
        return arith.evaluate(text, {"pi": pi})
    except Exception:  # noqa: BLE001 - not arithmetic: compared as text
        return text


def read_answer(answer: object, pi: float) -> object:
    """ToRA's reading of one side (see the module doc); may return a number, text or a value."""
    if isinstance(answer, str):
        if _DOLLAR_AMOUNT.match(answer):
            return answer[1:]
        if any(p.match(answer) for p in _PERCENTAGES):
            return answer.replace("\\%", "").replace("%", "")
        if "_" in answer:  # a base: 1010_2 -> 1010 (float() raises for anything else)
            return int(float(answer.split("_")[0]))
        if "\\pi" in answer:
            return _substitute_pi(answer, pi)
    return answer


def _interval_text(prediction: str) -> str:
    for pattern, left, right in _INTERVALS:
        found = pattern.match(prediction)
        if found:
            return f"{left}{found.group(1)}{right}"
    return prediction


def _numbers_close(prediction: object, reference: object, include_percentage: bool, tolerance: float) -> bool | None:
    """True/False when both read as numbers, None when either does not."""
    try:
        if _as_number(prediction)[0] and _as_number(reference)[0]:
            pred, ref = _as_number(prediction)[1], _as_number(reference)[1]
            assert pred is not None and ref is not None
            candidates = [ref / 100, ref, ref * 100] if include_percentage else [ref]
            return any(isclose(c, pred, rel_tol=tolerance) for c in candidates)
    except Exception:  # noqa: BLE001 - as verl: then the other checks decide
        return None
    return None


def _all_equal(pairs: list[tuple[object, object]], include_percentage: bool, tolerance: float) -> bool:
    # every pair is compared before all() looks, as verl does: a later pair that raises aborts
    return all([math_equal(p, r, include_percentage, tolerance) for p, r in pairs])


def math_equal(
    prediction: object, reference: object, include_percentage: bool = True, tolerance: float = 1e-4, pi: float = math.pi
) -> bool:
    """True when the prediction equals the reference (see the module doc).

    Nested comparisons (parts of tuples, matrix entries) use pi = 3.141592653589793
    whatever ``pi`` is, as verl's do.

    Raises:
        Exception: on text verl's grader also fails on (the caller scores it as wrong).
    """
    prediction, reference = read_answer(prediction, pi), read_answer(reference, pi)
    if isinstance(prediction, str) and len(prediction) > MAX_PREDICTION_CHARS:
        prediction = prediction[:MAX_PREDICTION_CHARS]
    if isinstance(prediction, str) and isinstance(reference, str):
        if prediction.strip().lower() == reference.strip().lower():
            return True
        if prediction.replace(" ", "") == reference.replace(" ", ""):
            return True
    close = _numbers_close(prediction, reference, include_percentage, tolerance)
    if close is not None:
        return close
    if not prediction and prediction not in [0, False]:
        return False
    reference, prediction = str(reference).strip(), str(prediction).strip()
    prediction = _interval_text(prediction)
    if _without_brackets(prediction, reference):
        return True
    return _structure_equal(prediction, reference, include_percentage, tolerance, pi)


def _structure_equal(prediction: str, reference: str, include_percentage: bool, tolerance: float, pi: float) -> bool:
    """Steps 4 to 6 of the module doc: intervals, tuples, points, matrices."""
    if prediction and reference and prediction[0] in "([" and prediction[-1] in ")]":
        if prediction[0] == reference[0] and prediction[-1] == reference[-1]:
            pred_parts, ref_parts = prediction[1:-1].split(","), reference[1:-1].split(",")
            if len(pred_parts) == len(ref_parts) and _all_equal(
                list(zip(pred_parts, ref_parts)), include_percentage, tolerance
            ):
                return True
    if "," in prediction and "," in reference:
        pred_items = [item.strip() for item in prediction.split(",")]
        ref_items = [item.strip() for item in reference.split(",")]
        if len(pred_items) == len(ref_items):
            return _all_equal(list(zip(pred_items, ref_items)), include_percentage, tolerance)
    if prediction.startswith("Point") and reference[0] == "(" and reference[-1] == ")":
        pred_parts = prediction[prediction.find("(") + 1 : -1].split(",")
        ref_parts = reference[1:-1].split(",")
        if len(pred_parts) == len(ref_parts) and _all_equal(
            list(zip(pred_parts, ref_parts)), include_percentage, tolerance
        ):
            return True
    if PMATRIX in reference:
        return _matrix_equal(prediction, reference, include_percentage, tolerance, pi)
    return False


def _without_brackets(prediction: str, reference: str) -> bool:
    pred, ref = prediction, reference
    if (prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("(")) or (
        prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("[")
    ):
        pred, ref = pred.strip("[]()"), ref.strip("[]()")
    for bracket in "{}()":
        pred, ref = pred.replace(bracket, ""), ref.replace(bracket, "")
    return pred == ref


def _matrix_equal(prediction: str, reference: str, include_percentage: bool, tolerance: float, pi: float) -> bool:
    if prediction.startswith("Matrix"):
        try:
            entries = parse_matrix(prediction)
            ref_entries = reference.split()[1:-1:2]
            if len(entries) == len(ref_entries) and _all_equal(
                list(zip(entries, ref_entries)), include_percentage, tolerance
            ):
                return True
        except Exception:  # noqa: BLE001 - as verl: an unreadable matrix is not equal
            pass
    elif prediction.startswith("[") and prediction.endswith("]"):
        rows = arith.evaluate(prediction, {"pi": pi})  # outside the try, as in verl: what is not a list raises
        if isinstance(rows, list):
            try:
                body = reference.removeprefix("\\\\begin{pmatrix}").removeprefix(PMATRIX)
                body = body.removesuffix("\\\\end{pmatrix}").removesuffix(r"\end{pmatrix}")
                ref_rows = [row.split("&") if "&" in row else row for row in body.split("\\")]
                if len(rows) == len(ref_rows) and _all_equal(list(zip(rows, ref_rows)), include_percentage, tolerance):
                    return True
            except Exception:  # noqa: BLE001 - as verl: then not equal
                pass
    return False
