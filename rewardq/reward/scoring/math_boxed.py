r"""MATH scoring: the last ``\boxed{...}`` answer, compared after string normalisation.

This is the Hendrycks-MATH equivalence check (via lm-evaluation-harness, as in verl's
``math_reward.py``): extract the content of the last ``\boxed{}`` (or ``\boxed x`` or
``\fbox{}``), normalise both it and the ground truth with :func:`strip_string`
(drop spaces, ``\left``/``\right``, units, degrees, ``\$``; ``\dfrac``→``\frac``;
``\frac12``→``\frac{1}{2}``; ``a/b``→``\frac{a}{b}``; ``0.5``→``\frac{1}{2}``; ...), and
compare the strings::

    >>> compute_score(r"so the answer is $\boxed{\dfrac{1}{2}}$", "\\frac12")
    1.0
    >>> compute_score(r"\boxed{3}", "4")
    0.0

It is string equality, not symbolic: ``\boxed{0.25}`` does not equal ``\frac14``. For
symbolic equivalence use :mod:`rewardq.reward.scoring.math_verify_scorer`.

One deliberate difference from verl: verl finds ``\fbox{...}`` but then fails to
unwrap it (its ``remove_boxed`` only knows ``\boxed``) and scores 0.0; here
``\fbox{x}`` is unwrapped like ``\boxed{x}``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("rewardq.reward.scoring")


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer is equivalent to ``ground_truth``, else 0.0.

    Never raises on odd input: a malformed box (unbalanced braces) scores 0.0.
    """
    try:
        boxed = last_boxed_only_string(solution_str)
        if boxed is not None and is_equiv(remove_boxed(boxed), ground_truth):
            return 1.0
    except Exception:
        logger.debug("MATH scorer could not read the boxed answer", exc_info=True)
    return 0.0


def is_equiv(str1: str | None, str2: str | None) -> bool:
    """Equality after :func:`strip_string`; raw equality if normalisation fails."""
    if str1 is None and str2 is None:
        return True
    if str1 is None or str2 is None:
        return False
    try:
        return strip_string(str1) == strip_string(str2)
    except Exception:  # noqa: BLE001 - e.g. two "\text{ " unit markers
        return str1 == str2


def balanced_from(string: str, idx: int) -> str | None:
    """``string[idx:]`` up to the brace that closes the first ``{`` at or after ``idx``; None if unclosed."""
    depth = 0
    for i in range(idx, len(string)):
        if string[i] == "{":
            depth += 1
        elif string[i] == "}":
            depth -= 1
            if depth == 0:
                return string[idx : i + 1]
    return None


def last_boxed_only_string(string: str) -> str | None:
    r"""The last ``\boxed{...}`` (braces balanced), ``\boxed x`` or ``\fbox{...}``; None if absent."""
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None
    return balanced_from(string, idx)


def remove_boxed(s: str) -> str:
    r"""The content of ``\boxed{x}``, ``\boxed x`` or ``\fbox{x}``."""
    if s.startswith("\\boxed "):
        return s[len("\\boxed ") :]
    for left in ("\\boxed{", "\\fbox{"):
        if s.startswith(left) and s.endswith("}"):
            return s[len(left) : -1]
    raise ValueError(f"not a boxed expression: {s[:80]!r}")


def _fix_fracs(string: str) -> str:
    r"""``\frac12`` → ``\frac{1}{2}``, ``\frac1{72}`` → ``\frac{1}{72}``, ``\frac{a}b`` kept."""
    parts = string.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[0] == "{":  # an empty tail raises IndexError, which is_equiv turns into raw equality
            out += part
            continue
        if len(part) < 2:
            return string
        a, b, rest = part[0], part[1], part[2:]
        if b != "{":
            out += "{" + a + "}{" + b + "}" + rest
        else:
            out += "{" + a + "}" + b + rest
    return out


def _fix_a_slash_b(string: str) -> str:
    r"""``3/4`` → ``\frac{3}{4}`` when both sides are plain integers."""
    pieces = string.split("/")
    if len(pieces) != 2:
        return string
    try:
        a, b = int(pieces[0]), int(pieces[1])
    except ValueError:
        return string
    if string != f"{a}/{b}":
        return string
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def _remove_right_units(string: str) -> str:
    r"""Drop a trailing ``\text{ units}``; two such markers raise (caught by :func:`is_equiv`)."""
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        if len(splits) != 2:
            raise ValueError("more than one unit marker")
        return splits[0]
    return string


def _fix_sqrt(string: str) -> str:
    r"""``\sqrt3`` → ``\sqrt{3}``."""
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    out = splits[0]
    for split in splits[1:]:
        if split[:1] != "{":
            out += "\\sqrt{" + split[0] + "}" + split[1:]
        else:
            out += "\\sqrt" + split
    return out


def strip_string(string: str) -> str:
    """Normalise a LaTeX answer for string comparison (Hendrycks MATH rules, in order)."""
    string = string.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = _remove_right_units(string)
    string = string.replace("\\\\%", "").replace("\\%", "")
    # " .5" -> " 0.5", "{.5" -> "{0.5", ".5" -> "0.5"
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    # "k = 3" -> "3" (a short variable name before a single "=")
    sides = string.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        string = sides[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)
