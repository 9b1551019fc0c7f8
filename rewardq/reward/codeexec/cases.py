"""What a code problem is made of: the program in a response, the test cases in ``ground_truth``,
and the program text that actually runs.

Everything here is a pure function of its inputs (no processes, no I/O), shared by both
backends and tested on its own:

* :func:`extract_prime_code` / :func:`extract_fenced_code`: how verl's ``prime_code`` and
  ``sandbox_fusion`` modules cut the program out of a response (they differ);
* :func:`parse_test_cases`: ``ground_truth`` as a dict (``inputs``, ``outputs``, optional
  ``fn_name`` and ``assert_case``) from a dict or a JSON string;
* :func:`prime_module_source`: the module the local runner executes, built as verl's
  ``prime_code`` builds it (a fixed import preamble, and for standard-input problems the
  program moved into a function ``code()``);
* :func:`call_wrapper_source`: the program sent to SandboxFusion for call-based
  (``fn_name``) problems, which reads JSON arguments from stdin and prints the result.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any, cast

#: Modules every program sees star-imported (and most also imported by name), in this order;
#: both of verl's code scorers put exactly this preamble before the model's program.
PREAMBLE_STAR_MODULES = (
    "string",
    "re",
    "datetime",
    "collections",
    "heapq",
    "bisect",
    "copy",
    "math",
    "random",
    "statistics",
    "itertools",
    "functools",
    "operator",
    "io",
    "sys",
    "json",
    "builtins",
    "typing",
)
PREAMBLE_NAMED_MODULES = tuple(m for m in PREAMBLE_STAR_MODULES if m not in ("builtins", "typing"))


def preamble() -> str:
    """``from m import *`` for every preamble module, then ``import m`` for the named ones."""
    lines = [f"from {m} import *" for m in PREAMBLE_STAR_MODULES]
    lines += [f"import {m}" for m in PREAMBLE_NAMED_MODULES]
    return "\n".join(lines) + "\n"


#: The local runner's preamble also raises the recursion limit, as ``prime_code`` does.
PRIME_PREAMBLE = preamble() + "sys.setrecursionlimit(6*10**5)\n"


class InvalidTestCases(ValueError):
    """``ground_truth`` is not a usable set of test cases (scored 0.0, as verl scores it)."""


@dataclass(frozen=True)
class TestCases:
    """The test cases of one problem.

    Attributes:
        inputs: one entry per case: a stdin text (standard-input problems) or, for
            call-based ones, the arguments as JSON, one argument per line.
        outputs: the expected output of each case (text, or JSON for call-based).
        fn_name: the function (or ``Solution`` method) to call; None for stdin/stdout problems.
        assert_case: per-case assertion code appended to the program (SandboxFusion only).
    """

    __test__ = False  # not a pytest test class, whatever its name

    inputs: list[Any]
    outputs: list[Any]
    fn_name: str | None = None
    assert_case: list[str] | None = None


def parse_test_cases(ground_truth: Any, *, assert_cases: bool = True) -> TestCases:
    """``ground_truth`` (a dict or its JSON text) as :class:`TestCases`.

    With ``assert_cases`` an ``assert_case`` list stands in for missing ``inputs``/``outputs``,
    as verl's SandboxFusion scorer allows (``prime_code`` knows no ``assert_case``).

    Raises:
        InvalidTestCases: not JSON, not an object, or without ``inputs``/``outputs`` lists.
    """
    data = ground_truth
    if not isinstance(data, dict):
        try:
            data = json.loads(data)
        except (TypeError, ValueError) as exc:
            raise InvalidTestCases(f"ground_truth is not JSON test cases ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidTestCases(f"ground_truth must be a JSON object, got {type(data).__name__}")
    asserts = data.get("assert_case") if assert_cases else None
    if isinstance(asserts, list):
        inputs = data.get("inputs", ["" for _ in asserts])
        outputs = data.get("outputs", [None for _ in asserts])
    else:
        asserts = None
        if "inputs" not in data or "outputs" not in data:
            raise InvalidTestCases("ground_truth has no 'inputs' and 'outputs'")
        inputs, outputs = data["inputs"], data["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise InvalidTestCases("ground_truth 'inputs' and 'outputs' must be lists")
    fn_name = data.get("fn_name")
    return TestCases(inputs, outputs, None if fn_name is None else str(fn_name), asserts)


def extract_prime_code(completion: str) -> str:
    """``prime_code``'s cut: the text after the last ```` ```python ```` up to the next fence
    (the whole response when there is no such fence)."""
    return completion.split("```python")[-1].split("```")[0]


def extract_fenced_code(completion: str) -> str | None:
    """``sandbox_fusion``'s cut: the last ```` ```python ```` block, else the first fenced block
    without its language line; None when the response has no fence at all."""
    if "```python" in completion:
        return completion.split("```python")[-1].split("```")[0]
    if "```" not in completion:
        return None
    parts = completion.split("```")
    code = parts[1]
    if "\n" in code:
        first, rest = code.split("\n", 1)
        if first.strip().isalpha():
            code = rest
    return code


# -- the local runner's module ---------------------------------------------------------------
def _unwrap_main_guard(code: str) -> str:
    """If the program ends with ``if __name__ == '__main__':``, inline that block's body.

    Goes through ``ast.unparse`` as ``prime_code`` does, which also re-formats the program.
    """
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            # unparse of a statement list, not of a Module (which would re-quote a leading docstring)
            head = ast.unparse(cast(Any, tree.body[:-1]))
            return head + "\n" + ast.unparse(cast(Any, last.body))
    except Exception:  # noqa: BLE001 - a program that does not parse is left as it is (and fails to load)
        pass
    return code


def _is_import(line: str) -> bool:
    return line.startswith("from ") or line.startswith("import ")


def stdin_program_body(code: str) -> str:
    """A standard-input program turned into a function ``code()`` the runner can call per case.

    Line by line, as ``prime_code`` does it: lines starting with ``import``/``from`` stay at
    module level until the first other line; every other line is indented by a tab into
    ``def code():`` (preceded by ``stdin = sys.stdin`` and ``stdout = sys.stdout``); imports
    after that point go inside the function too.
    """
    out: list[str] = []
    started = False
    for raw in _unwrap_main_guard(code).split("\n"):
        if _is_import(raw):
            out.append(("\t" + raw if started else raw) + "\n")
            continue
        if not started:
            out.append("stdin = sys.stdin\nstdout = sys.stdout\ndef code():\n")
            started = True
        out.append("\t" + raw + "\n")
    return "".join(out)


def prime_module_source(code: str, fn_name: str | None) -> str:
    """The module the local runner executes for ``code``: the preamble, then the program as is
    (call-based) or wrapped into ``code()`` (standard input)."""
    return PRIME_PREAMBLE + (code if fn_name is not None else stdin_program_body(code))


# -- SandboxFusion's call-based wrapper -------------------------------------------------------
_CALL_WRAPPER = """
# --- the program under test ---
{program}
# --- end of the program under test ---

def _rewardq_call():
    raw = sys.stdin.read()
    args = []
    if raw.strip():
        try:
            args = [json.loads(line) for line in raw.split("\\n")]
        except json.JSONDecodeError as exc:
            sys.stderr.write("invalid JSON arguments for {fn_name!r}: %s\\n" % exc)
            return None, True
    try:
        target = None
        if {fn_name!r} in globals():
            target = globals()[{fn_name!r}]
        elif "Solution" in globals():
            target = getattr(globals()["Solution"](), {fn_name!r})
        if not target:
            sys.stderr.write("function or method {fn_name!r} not found\\n")
            return None, True
        return target(*args), False
    except Exception:
        sys.stderr.write(traceback.format_exc())
        return None, True


if __name__ == "__main__":
    _result, _failed = _rewardq_call()
    if not _failed:
        if isinstance(_result, (dict, list, tuple)) or _result is None or isinstance(_result, bool):
            print(json.dumps(_result))
        else:
            print(str(_result))
"""


def call_wrapper_source(program: str, fn_name: str) -> str:
    """The stdin/stdout program SandboxFusion runs for a call-based problem.

    It behaves as verl's wrapper does: arguments are JSON lines on stdin; the function is a
    global named ``fn_name`` or a method of ``Solution()``; containers, ``None`` and booleans
    are printed as JSON, anything else with ``str()``; any failure prints nothing (and exits 0),
    so it scores as a wrong answer.
    """
    return "import traceback\n" + preamble() + _CALL_WRAPPER.format(program=program, fn_name=fn_name)
