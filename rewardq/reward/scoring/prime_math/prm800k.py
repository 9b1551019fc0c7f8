r"""The PRM800K answer grader, as verl's ``prime_math`` runs it: normalise, then ask sympy.

:func:`grade_answer` says True when

1. both answers are equal after the Hendrycks-MATH normalisation
   (:func:`rewardq.reward.scoring.math_boxed.strip_string`), or
2. equal after :func:`normalize` (``\text{}``, ``$``, ``%``, units, ``million``, LaTeX
   to plain text with pylatexenc, lower case, ``1,000`` to ``1000``), or
3. for each part of a tuple or interval (same brackets, same number of parts), sympy
   simplifies ``(truth) - (given)`` to 0, each part within
   :data:`~rewardq.reward.scoring.prime_math.arith.PRIME_MATH_SYMPY_TIMEOUT` seconds. Unreduced fractions must
   match as written, and an integer must be matched by an integer.

sympy is not asked about text with more than two distinct letters or exponents such as
``^{``, ``^(`` or ``^12`` (they can run for minutes).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import sympy
from pylatexenc import latex2text
from sympy.parsing import sympy_parser

from rewardq.reward.scoring.math_boxed import strip_string
from rewardq.reward.scoring.prime_math.arith import PRIME_MATH_SYMPY_TIMEOUT
from rewardq.reward.scoring.time_limit import time_limit

__all__ = ["grade_answer", "normalize", "hendrycks_normalize"]

logger = logging.getLogger("rewardq.reward.scoring")

UNITS = (
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
    "liter",
)
_UNIT_PATTERNS = tuple(re.compile(unit + r"(es)?(s)? *(\^[0-9]+)?") for unit in UNITS)
_TEXT_WRAPPER = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_SPELLED_POWERS = (("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12"))
_LATEX_SYMBOLS = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*"))
#: Exponent forms sympy may take minutes over: not evaluated at all.
BAD_SUBSTRINGS = ("^{", "^(")
BAD_PATTERNS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_FORMATTED_COMMA = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER = re.compile(r"([0-9]) +([0-9])")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
TUPLE_CHARS = "()[]"
_TRANSFORMS = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)


def hendrycks_normalize(answer: str) -> str:
    r"""Hendrycks-MATH normalisation after dropping a ``\text{}`` wrapper; the input unchanged if it fails."""
    answer = answer.strip()
    try:
        wrapped = _TEXT_WRAPPER.search(answer)
        if wrapped is not None:
            answer = wrapped.group("text").strip()
        return strip_string(answer)
    except Exception:  # noqa: BLE001 - e.g. two unit markers: compare the text as it is
        return answer


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _is_whole(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def _strip_formatted_commas(text: str) -> str:
    """``1,234,567`` to ``1234567``, leaving tuple commas such as ``(1,2)`` alone."""
    while True:
        stripped = _FORMATTED_COMMA.sub(r"\1\3\4", text)
        if stripped == text:
            return stripped
        text = stripped


def _str_is_int(text: str) -> bool:
    try:
        return _is_whole(float(_strip_formatted_commas(text)))
    except ValueError:
        return False


def _latex_to_text(expr: str) -> str:
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    expr = expr.replace("\\frac", " \\frac")  # keeps mixed numbers apart: 7\frac{3}{4}
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for symbol, word in _LATEX_SYMBOLS:
        expr = expr.replace(symbol, word)
    return expr.strip()


def normalize(expr: str) -> str:
    """PRM800K's second normalisation (see the module doc)."""
    wrapped = _TEXT_WRAPPER.search(expr)
    if wrapped is not None:
        expr = wrapped.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    for word, power in _SPELLED_POWERS:
        expr = expr.replace(word, power)
    for unit in _UNIT_PATTERNS:
        expr = unit.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if len(expr) > 0 and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _is_whole(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        try:
            expr = _latex_to_text(expr)
        except Exception:  # noqa: BLE001 - text pylatexenc cannot read stays as it is
            logger.debug("pylatexenc could not read %r", expr[:80])
    expr = re.sub("- *", "-", expr)  # "- 3" -> "-3"
    expr = _MIXED_NUMBER.sub(r"\1+\2", expr)  # "7 3/4" -> "7+3/4"
    expr = expr.lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _sympy_may_evaluate(expr: str) -> bool:
    letters = {ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()}
    if len(letters) > 2:
        return False
    if any(bad in expr for bad in BAD_SUBSTRINGS):
        return False
    return all(pattern.search(expr) is None for pattern in BAD_PATTERNS)


def _equal_under_sympy(truth: str, given: str) -> bool:
    expr = f"({truth})-({given})"
    if not _sympy_may_evaluate(expr):
        return False
    try:
        with time_limit(PRIME_MATH_SYMPY_TIMEOUT, "a sympy comparison"):
            difference = sympy_parser.parse_expr(expr.replace("^", "**"), transformations=_TRANSFORMS)
            return bool(sympy.simplify(difference) == 0)
    except TimeoutError:
        logger.info("sympy gave up comparing %r and %r after %gs", truth[:80], given[:80], PRIME_MATH_SYMPY_TIMEOUT)
        return False
    except Exception:  # noqa: BLE001 - text sympy cannot parse or compare is not equal
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_formatted_commas(expr)
    if len(expr) == 0:
        return []
    if len(expr) > 2 and expr[0] in TUPLE_CHARS and expr[-1] in TUPLE_CHARS:
        if all(ch not in expr[1:-1] for ch in TUPLE_CHARS):
            return [part.strip() for part in expr[1:-1].split(",")]
    return [expr]


def _parts_equal(truth: str, given: str) -> bool:
    if _FRACTION.search(truth) and _FRACTION.search(given):
        return truth == given  # an unreduced fraction is wrong: no sympy
    if _str_is_int(truth) != _str_is_int(given):
        return False  # an integer answer must be matched by an integer
    return _equal_under_sympy(truth, given)


def grade_answer(given: Any, truth: str) -> bool:
    """True when ``given`` equals ``truth`` (see the module doc)."""
    if given is None:
        return False
    if hendrycks_normalize(truth) == hendrycks_normalize(given):
        return True
    truth_n, given_n = normalize(truth), normalize(given)
    if truth_n == given_n:
        return True
    if len(given_n) == 0:
        return False
    truth_parts, given_parts = _split_tuple(truth_n), _split_tuple(given_n)
    if len(truth_parts) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
        return False  # different brackets: [a, b] is not (a, b)
    if len(truth_parts) != len(given_parts):
        return False
    return all(_parts_equal(t, g) for t, g in zip(truth_parts, given_parts))
