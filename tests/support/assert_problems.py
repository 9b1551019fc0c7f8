"""The ``assert_case`` problems the local runner's tests share (:mod:`tests.support.assert_cases`):
each is ``ground_truth`` as verl's SandboxFusion path takes it: ``assert_case`` (one test text per
case), optional ``inputs`` (stdin), ``outputs`` (expected stdout, None: any) and ``fn_name``; and
:class:`AssertCase`, one response to one problem with what it must score."""

from __future__ import annotations

import json
from dataclasses import dataclass
from textwrap import dedent
from typing import Any


def P(text: str) -> str:
    """A program written as an indented block."""
    return dedent(text).strip("\n")


@dataclass(frozen=True)
class AssertCase:
    """One response to one problem, and what it must score."""

    name: str
    program: str
    ground_truth: dict[str, Any]
    score: float
    tripwire: str = ""

    @property
    def completion(self) -> str:
        return f"Here is my solution.\n```python\n{self.program}\n```"

    @property
    def gt_json(self) -> str:
        return json.dumps(self.ground_truth)


ADD = {
    "assert_case": ["assert add(1, 2) == 3\nassert add(-1, 1) == 0", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]
}
SORT = {
    "assert_case": [
        "assert sort_desc([3, 1, 2]) == [3, 2, 1]",
        "assert sort_desc([]) == []",
        "for xs in ([1], [2, 2], [5, -1, 3]):\n    assert sort_desc(xs) == sorted(xs, reverse=True)",
    ]
}
STACK = {
    "assert_case": [
        "s = Stack()\nassert not s\ns.push(1)\ns.push(2)\nassert len(s) == 2\nassert s.pop() == 2\nassert s",
        "s = Stack()\ntry:\n    s.pop()\n    assert False, 'pop must raise'\nexcept IndexError:\n    pass",
    ]
}
POINT = {
    "assert_case": [
        "assert midpoint(Point(0, 0), Point(2, 2)) == Point(1, 1)",
        "assert midpoint(Point(1, 1), Point(1, 1)) != Point(0, 0)",
    ]
}
GEN = {
    "assert_case": [
        "assert list(primes(10)) == [2, 3, 5, 7]",
        "g = primes(100)\nassert next(g) == 2 and next(g) == 3\nassert sum(primes(20)) == 77",
    ]
}
FLOAT = {
    "assert_case": [
        "import math\nassert math.isclose(mean([1, 2, 3, 4]), 2.5)",
        "assert abs(mean([0.1, 0.2]) - 0.15) < 1e-9",
    ]
}
WORDS = {
    "assert_case": [
        "assert word_count('a b a') == {'a': 2, 'b': 1}",
        "assert word_count('') == {}\nassert 'x' in word_count('x y')",
    ]
}
MATRIX = {
    "assert_case": [
        "import numpy as np\nassert np.array_equal(transpose([[1, 2], [3, 4]]), np.array([[1, 3], [2, 4]]))",
        "assert transpose([[1, 2, 3]]).shape == (3, 1)",
    ]
}
PYTEST = {
    "assert_case": [
        "from solution import is_palindrome\n\ndef test_yes():\n    assert is_palindrome('abba')\n\n"
        "def test_no():\n    assert not is_palindrome('abc')"
    ]
}
HUMANEVAL = {
    "assert_case": [
        "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n    assert candidate([]) == 0\n\ncheck(total)"
    ]
}
STDOUT = {"assert_case": ["greet('Ada')"], "outputs": ["Hello, Ada!\n"]}
CALL = {
    "assert_case": ["assert square(3) == 9", "assert square(-2) == 4"],
    "inputs": ["4", "5"],
    "outputs": ["16", "25"],
    "fn_name": "square",
}

HYPOT = {"assert_case": ["assert hyp(3, 4) == 5.0\nassert round(hyp(1, 1), 3) == round(pow(2, 0.5), 3)"]}

UNITTEST = {
    "assert_case": [
        "import unittest\n\nclass TestAdd(unittest.TestCase):\n    def test_small(self):\n"
        "        self.assertEqual(add(1, 2), 3)\n        self.assertTrue(add(0, 0) == 0)\n\n"
        "    def test_negative(self):\n        self.assertEqual(add(-1, 1), 0)\n\n"
        "unittest.main(exit=False)",
        "import unittest\n\nclass TestAdd(unittest.TestCase):\n    def test_four(self):\n"
        "        self.assertEqual(add(2, 2), 4)\n\nif __name__ == '__main__':\n    unittest.main()",
        # never runs its tests itself: they are run, as pytest would
        "import unittest\n\nclass TestAdd(unittest.TestCase):\n    def test_zero(self):\n"
        "        self.assertEqual(add(0, 5), 5)",
    ]
}
UNITTEST_TRUTH = {
    "assert_case": [
        "import unittest\n\nclass TestPal(unittest.TestCase):\n    def test_yes(self):\n"
        "        self.assertTrue(is_palindrome('abba'))\n\nunittest.main(exit=False)"
    ]
}
