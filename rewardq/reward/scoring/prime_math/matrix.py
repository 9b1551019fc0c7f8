"""sympy's reading of a ``Matrix(...)`` answer, for plain matrix text only.

verl's ToRA grader hands a ``Matrix(...)`` prediction to sympy's ``parse_expr``, which
runs the text through ``eval``: model-written code would run in the scorer. Here the text
must first be a Python expression made only of numbers, single-letter symbols, the names
in :data:`MATRIX_NAMES` called or used plainly, lists, tuples and arithmetic; no strings,
attributes, subscripts or keywords; no list repetition; no constant power too large to
compute (:mod:`.arith`'s bound). Anything else raises :class:`ValueError`, which the
grader treats as an unreadable matrix (not equal), as verl does with text sympy cannot
parse. Parsing runs under :data:`~rewardq.reward.scoring.prime_math.arith.PRIME_MATH_SYMPY_TIMEOUT`.
"""

from __future__ import annotations

import ast
from typing import Any

from rewardq.reward.scoring.prime_math import arith
from rewardq.reward.scoring.prime_math.arith import PRIME_MATH_SYMPY_TIMEOUT
from rewardq.reward.scoring.time_limit import time_limit

__all__ = ["parse_matrix", "MATRIX_NAMES", "MAX_SYMBOLIC_EXPONENT"]

#: Names a matrix answer may use, besides single letters (symbols).
MATRIX_NAMES = frozenset({"Matrix", "sqrt", "pi", "E", "I", "oo", "Rational", "sin", "cos", "tan", "log", "exp"})
#: Largest constant exponent over a symbolic base (``x**1000``).
MAX_SYMBOLIC_EXPONENT = 1000
_STRUCTURE = (ast.Expression, ast.List, ast.Tuple, ast.UnaryOp, ast.BinOp, ast.expr_context, ast.operator, ast.unaryop)


def parse_matrix(text: str) -> Any:
    """``sympy.parsing.sympy_parser.parse_expr(text)`` once :func:`check_plain` accepts ``text``."""
    check_plain(text)
    from sympy.parsing.sympy_parser import parse_expr

    with time_limit(PRIME_MATH_SYMPY_TIMEOUT, "parsing a matrix answer"):
        return parse_expr(text)


def check_plain(text: str) -> None:
    """Raise ValueError unless ``text`` is plain matrix arithmetic (see the module doc)."""
    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in MATRIX_NAMES) or node.keywords:
                raise ValueError("only the allowed names may be called, without keywords")
        elif isinstance(node, ast.Name):
            if node.id not in MATRIX_NAMES and not (len(node.id) == 1 and node.id.isalpha()):
                raise ValueError(f"name {node.id!r} is not allowed in a matrix answer")
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float, complex)):
                raise ValueError("only numbers may be constants in a matrix answer")
        elif isinstance(node, ast.BinOp):
            _check_operation(node)
        elif not isinstance(node, _STRUCTURE):
            raise ValueError(f"{type(node).__name__} is not allowed in a matrix answer")


def _is_constant(node: ast.AST) -> bool:
    return all(not isinstance(n, (ast.Name, ast.Call)) for n in ast.walk(node))


def _check_operation(node: ast.BinOp) -> None:
    sides = (node.left, node.right)
    if isinstance(node.op, ast.Mult) and any(isinstance(side, (ast.List, ast.Tuple)) for side in sides):
        raise ValueError("list repetition is not allowed in a matrix answer")
    if isinstance(node.op, ast.Pow):
        if _is_constant(node):
            arith.evaluate(ast.unparse(node))  # raises when the power is too large to compute
        elif _is_constant(node.right):
            exponent = arith.evaluate(ast.unparse(node.right))
            if isinstance(exponent, (int, float)) and abs(exponent) > MAX_SYMBOLIC_EXPONENT:
                raise ValueError("exponent too large")
