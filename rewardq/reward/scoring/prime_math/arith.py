"""Evaluate the arithmetic in an answer as Python's ``eval`` would, without running code.

verl's ToRA grader calls ``eval()`` on model-written text (an answer containing ``\\pi``
once it became ``2*3.141592653589793``, and ``[...]`` answers compared with a matrix).
:func:`evaluate` gives the same value for the same arithmetic: it parses the text with
:mod:`ast` and applies Python's own operators to numbers, strings, tuples, lists, sets and dicts,
so ``str()`` of the result and whether it raises match ``eval``. It refuses, with
:class:`ValueError`, what ``eval`` would run but an answer never needs: names other than
those given, calls, attributes, subscripts, comprehensions, lambdas, and results too large
to compute quickly (``9**9**9``, ``[0]*10**12``), which would stall the scorer.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["evaluate", "MAX_INT_BITS", "MAX_SEQUENCE_LENGTH"]

#: Seconds one sympy comparison of the ``numina_*`` scorer may take before it counts as
#: "not equal" (verl's ``prime_math`` limit; each part of a tuple answer gets its own).
PRIME_MATH_SYMPY_TIMEOUT = 10.0


#: Largest integer result, in bits, that :func:`evaluate` computes (about 30,000 digits).
MAX_INT_BITS = 100_000
#: Largest string, tuple or list that a repetition (``seq * n``) may build.
MAX_SEQUENCE_LENGTH = 1_000_000

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.BitAnd: operator.and_,
    ast.MatMult: operator.matmul,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
    ast.Invert: operator.invert,
    ast.Not: operator.not_,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_SEQUENCES = (str, bytes, tuple, list)


def evaluate(text: str, names: Mapping[str, object] | None = None) -> Any:
    """The value ``eval(text)`` would give, with only ``names`` defined.

    Raises:
        SyntaxError: the text is not a Python expression (as ``eval`` would).
        ValueError: the expression needs more than arithmetic, or too large a result.
        ArithmeticError, TypeError: what the operation itself raises (as ``eval`` would).
    """
    tree = ast.parse(text.lstrip(" \t"), mode="eval")  # eval() skips leading blanks too
    return _value(tree.body, dict(names or {}))


def _value(node: ast.AST, names: dict[str, object]) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left, names), _value(node.right, names)
        _check_size(node.op, left, right)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand, names))
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        return _compare(node, names)
    if isinstance(node, ast.Tuple):
        return tuple(_value(e, names) for e in node.elts)
    if isinstance(node, ast.List):
        return [_value(e, names) for e in node.elts]
    if isinstance(node, ast.Set):
        return {_value(e, names) for e in node.elts}
    if isinstance(node, ast.Dict) and all(key is not None for key in node.keys):
        return {_value(k, names): _value(v, names) for k, v in zip(node.keys, node.values) if k is not None}
    raise ValueError(f"not plain arithmetic: {type(node).__name__}")


def _compare(node: ast.Compare, names: dict[str, object]) -> object:
    left = _value(node.left, names)
    result: Any = True
    for op, comparator in zip(node.ops, node.comparators):
        right = _value(comparator, names)
        result = _COMPARE[type(op)](left, right)
        if not result:
            return result
        left = right
    return result


def _check_size(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse an operation whose result would be too large to build quickly."""
    ints = isinstance(left, int) and isinstance(right, int)
    if isinstance(op, ast.Pow) and ints and right > 0 and abs(left) > 1:
        if abs(left).bit_length() * right > MAX_INT_BITS:
            raise ValueError("integer power too large")
    elif isinstance(op, ast.LShift) and ints and right > 0 and left != 0:
        if left.bit_length() + right > MAX_INT_BITS:
            raise ValueError("shift too large")
    elif isinstance(op, ast.Mult):
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, _SEQUENCES) and isinstance(count, int) and len(seq) * count > MAX_SEQUENCE_LENGTH:
                raise ValueError("repetition too large")
