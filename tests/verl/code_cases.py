"""Code problems for the parity tests: both modes (stdin/stdout and call-based ``fn_name``),
right, wrong, partially right, compile error, runtime error, timeout, and the corners of
``prime_code``'s comparison rules."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class CodeCase:
    name: str
    data_source: str
    completion: str
    ground_truth: str


def fenced(code: str, prose: str = "") -> str:
    return f"{prose}```python\n{code}\n```"


ADD = json.dumps({"inputs": ["1 2\n", "3 4\n", "10 20\n"], "outputs": ["3\n", "7\n", "30\n"]})
ADD_LONG = json.dumps(
    {"inputs": [f"{i} {i}\n" for i in range(12)], "outputs": [f"{2 * i}\n" for i in range(12)]}
)  # 12 cases: only the first 10 count
LINES = json.dumps({"inputs": ["3\n1 2 3\n", "2\n5 5\n"], "outputs": ["1\n2\n3\n", "5\n5\n"]})
THIRD = json.dumps({"inputs": ["3\n", "7\n"], "outputs": ["0.333333\n", "0.142857\n"]})
ONE = json.dumps({"inputs": ["4\n"], "outputs": ["16\n"]})
CALL_ADD = json.dumps({"fn_name": "add", "inputs": ["1\n2", "3\n4", "10\n20"], "outputs": ["3", "7", "30"]})
CALL_PAIR = json.dumps({"fn_name": "pair", "inputs": ["1", "2"], "outputs": ["[1, 2]", "[2, 3]"]})
CALL_DICT = json.dumps({"fn_name": "square_map", "inputs": ["2"], "outputs": ['{"1": 1, "2": 4}']})
CALL_NONE = json.dumps({"fn_name": "nothing", "inputs": ["1", "2"], "outputs": ["null", "null"]})
CALL_FLAG = json.dumps({"fn_name": "even", "inputs": ["2", "3"], "outputs": ["true", "false"]})
CALL_FLOAT = json.dumps({"fn_name": "third", "inputs": ["0.1\n0.2"], "outputs": ["0.3"]})
CALL_TUPLES = json.dumps({"fn_name": "pairs", "inputs": ["2"], "outputs": ["[[0, 0], [1, 1]]"]})

READ_ADD = "a, b = map(int, input().split())\nprint(a + b)"

CASES = [
    # -- standard input, right ------------------------------------------------------------
    CodeCase("stdin-right", "codecontests", fenced(READ_ADD), ADD),
    CodeCase("stdin-right-prose", "apps", fenced(READ_ADD, "Here is my solution:\n"), ADD),
    CodeCase("stdin-right-bare-code", "taco", READ_ADD, ADD),
    CodeCase(
        "stdin-right-main-guard",
        "codeforces",
        fenced(
            "def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\n"
            "if __name__ == '__main__':\n    main()"
        ),
        ADD,
    ),
    CodeCase(
        "stdin-right-sys-stdin",
        "codecontests",
        fenced("import sys\nx = sys.stdin.read().split()\nprint(sum(map(int, x)))"),
        ADD,
    ),
    CodeCase("stdin-right-open0", "codecontests", fenced("a, b = map(int, open(0).read().split())\nprint(a + b)"), ADD),
    CodeCase(
        "stdin-right-builtins-open",
        "codecontests",
        fenced("import builtins\nprint(sum(map(int, builtins.open(0).read().split())))"),
        ADD,
    ),
    CodeCase(
        "stdin-right-readline-past-eof",
        "codecontests",
        fenced(
            "import sys\na = sys.stdin.readline()\nb = sys.stdin.readline()\n"
            "print(sum(map(int, a.split())) if b == '' else 0)"
        ),
        ADD,
    ),
    CodeCase("stdin-right-sys-exit", "codecontests", fenced(READ_ADD + "\nimport sys\nsys.exit(0)"), ADD),
    CodeCase(
        "stdin-right-lines", "codecontests", fenced("n = int(input())\nfor x in input().split():\n    print(x)"), LINES
    ),
    CodeCase(
        "stdin-right-spaces",
        "codecontests",
        fenced("n = int(input())\nfor x in input().split():\n    print(x, ' ')\nprint()"),
        LINES,
    ),
    CodeCase("stdin-right-float-tolerance", "codecontests", fenced("print(1 / int(input()))"), THIRD),
    CodeCase(
        "stdin-right-12-cases", "codecontests", fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD_LONG
    ),
    # -- standard input, wrong and partial ----------------------------------------------------
    CodeCase("stdin-wrong", "codecontests", fenced("print(0)"), ADD),
    CodeCase(
        "stdin-wrong-extra-text",
        "codecontests",
        fenced("a, b = map(int, input().split())\nprint('Answer:', a + b)"),
        ADD,
    ),
    CodeCase(
        "stdin-wrong-leading-zero",
        "codecontests",
        fenced("a, b = map(int, input().split())\nprint('0' + str(a + b))"),
        ADD,
    ),
    CodeCase(
        "stdin-partial-2of3",
        "codecontests",
        fenced("a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)"),
        ADD,
    ),
    CodeCase("stdin-partial-1of3", "apps", fenced("a, b = map(int, input().split())\nprint(3)"), ADD),
    CodeCase(
        "stdin-partial-of-10",
        "taco",
        fenced("a, b = map(int, input().split())\nprint(a + b if a % 2 else -1)"),
        ADD_LONG,
    ),
    CodeCase("stdin-partial-float", "codecontests", fenced("n = int(input())\nprint(1 / 3)"), THIRD),
    # -- standard input, errors ----------------------------------------------------------------
    CodeCase("stdin-compile-error", "codecontests", fenced("def broken(:\n    pass"), ADD),
    CodeCase("stdin-indentation-error", "codecontests", fenced("a = 1\n  b = 2"), ADD),
    CodeCase("stdin-empty-program", "codecontests", "```python\n```", ADD),
    CodeCase("stdin-runtime-error", "codecontests", fenced("print(1 // 0)"), ADD),
    CodeCase(
        "stdin-runtime-error-partial",
        "codecontests",
        fenced("a, b = map(int, input().split())\nprint(a + b if a != 3 else 1 // 0)"),
        ADD,
    ),
    CodeCase("stdin-eof", "codecontests", fenced("a = input()\nb = input()\nprint(b)"), ADD),
    CodeCase("stdin-exit-builtin", "codecontests", fenced(READ_ADD + "\nexit()"), ADD),
    CodeCase(
        "stdin-stdin-buffer",
        "codecontests",
        fenced("import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))"),
        ADD,
    ),
    CodeCase("stdin-timeout", "codecontests", fenced("while True:\n    pass"), ONE),
    CodeCase(
        "stdin-timeout-partial",
        "codecontests",
        fenced("a, b = map(int, input().split())\nwhile a == 10:\n    pass\nprint(a + b)"),
        ADD,
    ),
    # -- call-based ----------------------------------------------------------------------------
    CodeCase("call-right", "apps", fenced("def add(a, b):\n    return a + b"), CALL_ADD),
    CodeCase(
        "call-right-solution-class",
        "taco",
        fenced("class Solution:\n    def add(self, a, b):\n        return a + b"),
        CALL_ADD,
    ),
    CodeCase("call-right-tuple", "apps", fenced("def pair(x):\n    return (x, x + 1)"), CALL_PAIR),
    CodeCase(
        "call-right-int-keys",
        "apps",
        fenced("def square_map(n):\n    return {i: i * i for i in range(1, n + 1)}"),
        CALL_DICT,
    ),
    CodeCase("call-right-none", "apps", fenced("def nothing(x):\n    return None"), CALL_NONE),
    CodeCase("call-right-bool", "apps", fenced("def even(x):\n    return x % 2 == 0"), CALL_FLAG),
    CodeCase(
        "call-right-list-of-tuples", "apps", fenced("def pairs(n):\n    return [(i, i) for i in range(n)]"), CALL_TUPLES
    ),
    CodeCase("call-wrong", "apps", fenced("def add(a, b):\n    return a - b"), CALL_ADD),
    CodeCase("call-partial", "apps", fenced("def add(a, b):\n    return a + b if a < 5 else 0"), CALL_ADD),
    CodeCase(
        "call-partial-that-also-reads-stdin",
        "apps",
        fenced(
            "def add(a, b):\n    return a + b if a < 5 else 0\nimport sys\ndata = sys.stdin.read().split()\n"
            "if data:\n    print(int(data[0]) + int(data[1]))"
        ),
        CALL_ADD,
    ),
    CodeCase("call-float-exact", "apps", fenced("def third(a, b):\n    return a + b"), CALL_FLOAT),
    CodeCase("call-set-result", "apps", fenced("def pair(x):\n    return {x, x + 1}"), CALL_PAIR),
    CodeCase("call-missing-function", "apps", fenced("def other(a, b):\n    return a + b"), CALL_ADD),
    CodeCase("call-compile-error", "apps", fenced("def add(a, b)\n    return a + b"), CALL_ADD),
    CodeCase("call-runtime-error", "apps", fenced("def add(a, b):\n    return a / 0"), CALL_ADD),
    CodeCase(
        "call-runtime-error-partial", "apps", fenced("def add(a, b):\n    return a + b if a != 3 else [][1]"), CALL_ADD
    ),
    CodeCase("call-timeout", "apps", fenced("def add(a, b):\n    while True:\n        pass"), CALL_ADD),
    # -- test cases that are not usable ---------------------------------------------------------
    CodeCase("gt-not-json", "codecontests", fenced(READ_ADD), "not json"),
    CodeCase("gt-no-outputs", "codecontests", fenced(READ_ADD), json.dumps({"inputs": ["1 2\n"]})),
    CodeCase(
        "gt-fewer-outputs",
        "codecontests",
        fenced(READ_ADD),
        json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n"]}),
    ),
]
