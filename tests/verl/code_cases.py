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

# -- imports: numpy and the standard library, as verl's prime_code gives them ----------------------
NUMS = json.dumps({"inputs": ["3\n1 2 3\n", "4\n5 5 5 5\n"], "outputs": ["6\n", "20\n"]})
MATRIX = json.dumps({"inputs": ["2\n1 2\n3 4\n", "2\n2 0\n0 2\n"], "outputs": ["-2\n", "4\n"]})
WORDS = json.dumps({"inputs": ["b a b\n", "x\n"], "outputs": ["b 2\n", "x 1\n"]})
CALL_NUMS = json.dumps({"fn_name": "stats", "inputs": ["[1, 2, 3, 4]", "[5]"], "outputs": ["[2.5, 2.5]", "[5.0, 5.0]"]})
CALL_PERMS = json.dumps({"fn_name": "perms", "inputs": ["3", "2"], "outputs": ["6", "2"]})


def _stdin(body: str) -> str:
    return fenced("n = int(input())\nxs = list(map(int, input().split()))\n" + body)


IMPORT_CASES = [
    CodeCase("numpy-sum", "codecontests", _stdin("import numpy as np\nprint(int(np.array(xs).sum()))"), NUMS),
    CodeCase("numpy-alias-first", "codecontests", fenced("import numpy as np\n" + READ_ADD), ADD),
    CodeCase(
        "numpy-det",
        "codeforces",
        fenced(
            "import numpy as np\nn = int(input())\nm = np.array([list(map(int, input().split())) for _ in range(n)])\n"
            "print(int(round(np.linalg.det(m))))"
        ),
        MATRIX,
    ),
    CodeCase(
        "numpy-call",
        "apps",
        fenced(
            "import numpy as np\n\ndef stats(xs):\n    a = np.array(xs, dtype=float)\n"
            "    return [float(a.mean()), float(np.median(a))]"
        ),
        CALL_NUMS,
    ),
    CodeCase(
        "numpy-scalar-result",
        "apps",
        fenced("import numpy as np\n\ndef perms(n):\n    return np.int64(6) if n == 3 else 2"),
        CALL_PERMS,
    ),
    CodeCase("array", "codecontests", _stdin("import array\nprint(sum(array.array('i', xs)))"), NUMS),
    CodeCase(
        "decimal", "codecontests", _stdin("from decimal import Decimal\nprint(int(sum(Decimal(x) for x in xs)))"), NUMS
    ),
    CodeCase(
        "fractions",
        "codecontests",
        _stdin("from fractions import Fraction\nprint(int(sum(Fraction(x) for x in xs)))"),
        NUMS,
    ),
    CodeCase(
        "heapq-bisect-deque",
        "codecontests",
        _stdin(
            "import heapq, bisect\nfrom collections import deque\nh = list(xs)\nheapq.heapify(h)\n"
            "d = deque(sorted(h))\nbisect.insort(d, 0)\nprint(sum(d))"
        ),
        NUMS,
    ),
    CodeCase(
        "itertools-call",
        "apps",
        fenced("import itertools\n\ndef perms(n):\n    return len(list(itertools.permutations(range(n))))"),
        CALL_PERMS,
    ),
    CodeCase(
        "lru-cache-recursion",
        "codecontests",
        _stdin(
            "from functools import lru_cache\n@lru_cache(None)\ndef s(i):\n"
            "    return 0 if i < 0 else xs[i] + s(i - 1)\nprint(s(n - 1))"
        ),
        NUMS,
    ),
    CodeCase("statistics", "codecontests", _stdin("import statistics\nprint(int(statistics.mean(xs) * n))"), NUMS),
    CodeCase(
        "counter-words",
        "codecontests",
        fenced("from collections import Counter\nw, c = Counter(input().split()).most_common(1)[0]\nprint(w, c)"),
        WORDS,
    ),
    CodeCase(
        "datetime-re-string",
        "codecontests",
        _stdin(
            "import re, string, datetime\nd = datetime.date(2024, 1, 1) + datetime.timedelta(days=sum(xs))\n"
            "print(int(re.sub('[^0-9]', '', str(d.day))) * 0 + sum(xs) + len(string.ascii_letters) * 0)"
        ),
        NUMS,
    ),
    CodeCase(
        "unicodedata-zlib-hashlib",
        "codecontests",
        _stdin(
            "import unicodedata, zlib, hashlib\n"
            "assert unicodedata.name('a') and zlib.crc32(b'a') and hashlib.md5(b'a')\n"
            "print(sum(xs))"
        ),
        NUMS,
    ),
    CodeCase(
        "struct-math",
        "codecontests",
        _stdin("import struct, math\nprint(struct.unpack('<q', struct.pack('<q', sum(xs)))[0] + math.gcd(0, 0))"),
        NUMS,
    ),
    CodeCase(
        "platform-multiprocessing",
        "codecontests",
        _stdin("import platform, multiprocessing\nplatform.python_version()\nprint(sum(xs))"),
        NUMS,
    ),
    CodeCase(
        "typing-dataclasses",
        "codecontests",
        _stdin("from dataclasses import dataclass\n@dataclass\nclass P:\n    v: int\nprint(sum(P(x).v for x in xs))"),
        NUMS,
    ),
    CodeCase("subprocess-blocked", "codecontests", _stdin("import subprocess\nprint(sum(xs))"), NUMS),
    CodeCase("ctypes-blocked", "codecontests", _stdin("import ctypes\nprint(sum(xs))"), NUMS),
    CodeCase("os-putenv-guarded", "codecontests", _stdin("import os\nos.putenv('X', '1')\nprint(sum(xs))"), NUMS),
]
