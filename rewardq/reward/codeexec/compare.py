"""Is a program's output right? ``prime_code``'s rules, applied in the worker.

verl's ``prime_code`` compares inside the process that runs the model's program, so the
program could reach the expected outputs, or return an object whose ``__eq__`` always says
yes. Here the sandboxed program never sees the expected outputs: it reports what it printed
(standard-input problems) or what its function returned, as plain data, and the worker
decides with the same rules ``prime_code`` applies (:func:`stdin_verdict`,
:func:`call_verdict`).

A returned value crosses the process boundary as tagged JSON (:func:`decode_value`), so the
types the comparison depends on survive: tuples stay tuples, dict keys keep their type
(``{1: 2}`` is not ``{"1": 2}``), and ``inf``/``nan`` keep their value.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CaseAbort", "expected_for_case", "stdin_verdict", "call_verdict", "decode_value"]


class CaseAbort(Exception):
    """A test case ``prime_code`` cannot even start (bad expected output, non-text input):
    there its whole run dies, so every case of that run counts as ``-1``."""


def _int_keys(d: dict[str, object]) -> dict[int, object]:
    return {int(k): v for k, v in d.items()}


def _convert_dict_keys(value: Any) -> object:
    """``prime_code`` undoes JSON's string keys: a dict (or a list starting with one) becomes a
    one-element list holding that dict with integer keys, when every key converts."""
    try:
        if isinstance(value, dict):
            value = [_int_keys(value)]
    except (ValueError, TypeError):  # a key that is not an integer leaves the value as it is
        pass
    try:
        if isinstance(value[0], dict):
            value = [_int_keys(value[0])]
    except (TypeError, IndexError, KeyError, ValueError):  # not indexable, empty, or non-integer keys: unchanged
        pass
    return value


def expected_for_case(raw: object, call_based: bool) -> object:
    """The expected output of one case, as ``prime_code`` prepares it before comparing.

    Raises:
        CaseAbort: the expected output is not text (both modes), or not JSON (call-based).
    """
    if not isinstance(raw, str):
        raise CaseAbort(f"expected output must be text, got {type(raw).__name__}")
    if not call_based:
        return raw
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise CaseAbort(f"expected output is not JSON ({exc})") from None
    return _convert_dict_keys(value)


def _int_like(v: object) -> bool:
    return isinstance(v, int) or (isinstance(v, str) and v.isdigit())


def _close_floats(output: list[str], expected: list[str]) -> bool:
    """Both lists parse as floats of the same length and agree within ``numpy.allclose``'s
    default tolerance (False when any element does not parse)."""
    import numpy as np

    try:
        out = [float(e) for e in output]
        exp = [float(e) for e in expected]
    except (TypeError, ValueError):
        return False
    return len(out) == len(exp) and bool(np.allclose(out, exp))


def stdin_verdict(printed: str, expected: str) -> bool:
    """Does ``printed`` (a standard-input program's whole stdout) match ``expected``?

    The rules, tried in order (the first that holds wins):

    1. equal after stripping both ends (also after stripping every printed line);
    2. the printed lines equal the expected text's non-empty lines, each stripped;
    3. the same, with empty printed lines dropped;
    4. unless every pair of lines is a pair of digit strings: as many lines, each a float,
       all close (``numpy.allclose`` defaults);
    5. both are empty once blank lines are dropped.
    """
    lines = printed.splitlines()
    want = expected.strip()
    if "\n".join(lines).strip() == want or "\n".join(x.strip() for x in lines).strip() == want:
        return True
    if lines == [expected]:
        return True
    want_lines = [x.strip() for x in expected.split("\n") if len(x)]
    if lines == want_lines:
        return True
    lines = [x for x in lines if len(x)]
    same = lines == want_lines
    try:
        # all() stops at the first non-integer pair, before zip(strict=True) sees a length mismatch
        all_ints = all(_int_like(a) and _int_like(b) for a, b in zip(lines, want_lines, strict=True))
        if not all_ints:
            same = same or _close_floats(lines, want_lines)
    except ValueError:  # zip: different numbers of lines
        pass
    if same:
        return True
    # prime_code's last test compares the printed lines with the expected lines as sets of
    # words, which only an empty output against an all-blank expectation passes
    return not lines and not want_lines


def call_verdict(value: Any, expected: Any) -> bool:
    """Does a function's return ``value`` match ``expected`` (already JSON-decoded)?

    A tuple is compared as a list; a value also matches the first element of an expected
    list; a list of tuples also matches as a list of lists.
    """
    if isinstance(value, tuple):
        value = list(value)
    same = value == expected
    if isinstance(expected, list) and expected:
        same = same or value == expected[0]
    try:
        if isinstance(value[0], tuple):
            same = same or [list(x) for x in value] == expected[0]
    except (TypeError, IndexError, KeyError):  # not indexable, empty, or not a list of rows: no third chance
        pass
    return same is True


# -- the value a call-based program returned ----------------------------------------------
def _hook(obj: dict[str, object]) -> object:
    if len(obj) != 1:
        raise ValueError(f"unexpected object {sorted(obj)[:3]}")
    [(tag, body)] = obj.items()
    if tag == "t" and isinstance(body, list):
        return tuple(body)
    if tag == "d" and isinstance(body, list):
        return {k: v for k, v in body}
    if tag == "f" and body in ("inf", "-inf", "nan"):
        return float(body)
    raise ValueError(f"unexpected tag {tag!r}")


def decode_value(text: str) -> object:
    """The plain value a sandboxed function returned, from the runner's tagged JSON:
    lists are JSON arrays, ``{"t": [...]}`` a tuple, ``{"d": [[k, v], ...]}`` a dict,
    ``{"f": "inf"}`` a non-finite float.

    Raises:
        ValueError: the text is not such an encoding (the case then counts as a wrong answer).
    """
    try:
        return json.loads(text, object_hook=_hook)
    except (RecursionError, TypeError) as exc:
        raise ValueError(f"cannot decode the returned value: {exc}") from None
