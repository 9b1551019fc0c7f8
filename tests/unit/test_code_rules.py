"""Code execution's pure rules: cutting the program out, the program text, output comparison,
what a run's records mean, and how a SandboxFusion answer is read. No processes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest

from rewardq.errors import CodeSandboxError, SandboxUnavailableError
from rewardq.reward.codeexec import harness_program
from rewardq.reward.codeexec.cases import (
    InvalidTestCases,
    call_wrapper_source,
    extract_fenced_code,
    extract_prime_code,
    parse_test_cases,
    prime_module_source,
    stdin_program_body,
)
from rewardq.reward.codeexec.compare import CaseAbort, call_verdict, decode_value, expected_for_case, stdin_verdict
from rewardq.reward.codeexec.local import run_outcomes
from rewardq.reward.codeexec.result import CaseOutcome, summarize
from rewardq.reward.codeexec.sandbox import RunReport, RunSpec, parse_report
from rewardq.reward.codeexec.sandbox_fusion import classify, score_sandbox_fusion


# -- the program and its test cases -----------------------------------------------------------
def test_prime_code_takes_the_last_python_block_or_everything() -> None:
    assert extract_prime_code("x\n```python\na\n```\n```python\nb\n```") == "\nb\n"
    assert extract_prime_code("print(1)") == "print(1)"


def test_sandbox_fusion_needs_a_fence_and_drops_a_language_line() -> None:
    assert extract_fenced_code("no fence") is None
    assert extract_fenced_code("```cpp\nint main(){}\n```") == "int main(){}\n"
    assert extract_fenced_code("```\nprint(1)\n```") == "\nprint(1)\n"  # an empty first line stays


def test_test_cases_from_json_or_dict_and_bad_ones_named() -> None:
    tc = parse_test_cases('{"inputs": ["1"], "outputs": ["2"], "fn_name": "f"}')
    assert (tc.inputs, tc.outputs, tc.fn_name) == (["1"], ["2"], "f")
    assert parse_test_cases({"assert_case": ["assert f() == 1"]}).inputs == [""]
    with pytest.raises(InvalidTestCases, match="no 'inputs'"):
        parse_test_cases({"assert_case": ["assert True"]}, assert_cases=False)
    for bad in ("nope", "[1, 2]", '{"inputs": "x", "outputs": []}', None):
        with pytest.raises(InvalidTestCases):
            parse_test_cases(bad)


def test_stdin_program_moves_everything_but_leading_imports_into_code() -> None:
    body = stdin_program_body("import sys\nx = 1\nimport os\nprint(x)")
    assert body == "import sys\nstdin = sys.stdin\nstdout = sys.stdout\ndef code():\n\tx = 1\n\timport os\n\tprint(x)\n"
    guarded = stdin_program_body("def main():\n    print(1)\nif __name__ == '__main__':\n    main()")
    assert guarded.endswith("\tmain()\n") and "__name__" not in guarded


def test_modules_start_with_the_shared_preamble() -> None:
    src = prime_module_source("def f(): return 1", "f")
    assert src.startswith("from string import *\n") and src.endswith(
        "sys.setrecursionlimit(6*10**5)\ndef f(): return 1"
    )
    wrapper = call_wrapper_source("def f(a): return a", "f")
    compile(wrapper, "<wrapper>", "exec")
    assert "'f' in globals()" in wrapper


# -- comparison ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("printed", "expected", "ok"),
    [
        ("3\n", "3\n", True),
        ("  3  \n\n", "3", True),
        ("1 \n2\n", "1\n2\n", True),
        ("1\n\n2\n", "1\n2", True),
        ("0.3333333333\n", "0.333333\n", True),
        ("0.34\n", "0.333333\n", False),
        ("03\n", "3\n", False),  # digit strings are compared as text, not as numbers
        ("Answer: 3\n", "3\n", False),
        ("", "\n", True),
        ("1\n2\n", "1\n", False),
    ],
)
def test_stdin_verdict_follows_prime_code(printed: str, expected: str, ok: bool) -> None:
    assert stdin_verdict(printed, expected) is ok


def test_call_verdict_and_expected_values() -> None:
    assert call_verdict((1, 2), expected_for_case("[1, 2]", True))
    # a list of tuples matches only an expected list wrapped once more (prime_code's third chance)
    assert not call_verdict([(0, 0), (1, 1)], expected_for_case("[[0, 0], [1, 1]]", True))
    assert call_verdict([(0, 0), (1, 1)], expected_for_case("[[[0, 0], [1, 1]]]", True))
    assert call_verdict({1: 1, 2: 4}, expected_for_case('{"1": 1, "2": 4}', True))
    assert not call_verdict({"1": 1}, expected_for_case('{"1": 1}', True))  # keys became integers
    assert call_verdict(None, expected_for_case("null", True))
    assert not call_verdict(0.30000000000000004, expected_for_case("0.3", True))
    with pytest.raises(CaseAbort):
        expected_for_case("not json", True)
    with pytest.raises(CaseAbort):
        expected_for_case(["a list"], False)


def test_returned_values_round_trip_with_their_types() -> None:
    value = {"t": (1, [2.5, float("inf")]), 3: None, True: "x", 4.5: {"k": (1,)}}
    wire = json.dumps(harness_program.plain(value))
    back = decode_value(wire)
    assert back == value and isinstance(back["t"], tuple) and 3 in back
    with pytest.raises(ValueError):
        decode_value('{"evil": 1}')
    with pytest.raises(TypeError):
        harness_program.plain({1, 2})


# -- what a run's records mean ------------------------------------------------------------
SPEC = RunSpec([0, 1, 2], 5, 6.0)
OUTS = ["1\n", "2\n", "3\n"]


def _outs(records: list[Any], **status: Any) -> list[tuple[int | bool, str]]:
    return [(o.code, o.status) for o in run_outcomes(RunReport(records, **status), SPEC, OUTS, False, 1024)]


def test_run_outcomes_stop_at_the_first_failure() -> None:
    recs = [{"case": 0, "out": "1\n"}, {"case": 1, "out": "9\n"}, {"case": 2, "out": "3\n"}, {"done": True}]
    assert _outs(recs, exit=0) == [(True, "passed"), (False, "wrong_answer")]
    recs = [{"case": 0, "out": "1\n"}, {"case": 1, "error": "ZeroDivisionError: x"}]
    assert _outs(recs, exit=0) == [(True, "passed"), (-1, "runtime_error")]


def test_a_run_that_dies_or_does_not_load_fails_as_prime_code_says() -> None:
    assert _outs([{"load_error": "SyntaxError: x"}], exit=0) == [(-2, "compile_error")]
    assert _outs([{"case": 0, "out": "1\n"}], signal="SIGALRM") == [(-1, "timeout")] * 3
    assert _outs([{"case": 0, "out": "1\n"}], signal="SIGSEGV") == [(-1, "killed")] * 3
    assert _outs([{"case": 0, "out": "1\n"}], exit=0) == [(-1, "exited")] * 3
    assert _outs([{"case": 0, "out": "1\n"}, {"case": 1, "abort": "SystemExit: 3"}], exit=0) == [(-1, "aborted")] * 3
    # a wrong answer before the death is what prime_code would have returned
    assert _outs([{"case": 0, "out": "7\n"}], timed_out=True) == [(False, "wrong_answer")]
    # passes do not count from a run that did not end cleanly (records the program forged, then hung)
    passes = [{"case": i, "out": f"{i + 1}\n"} for i in range(3)] + [{"done": True}]
    assert _outs(passes, exit=0) == [(True, "passed")] * 3
    assert _outs(passes, timed_out=True) == [(-1, "timeout")] * 3


def test_report_lines_from_the_harness() -> None:
    out = (
        b'R {"case": 0, "out": "1\\n"}\nR garbled\nS {"exit": 0, "signal": null, "timed_out": false, '
        b'"overflow": false, "seconds": 0.1}\n'
    )
    [run] = parse_report(out, b"", 0, 1)
    assert run.records == [{"case": 0, "out": "1\n"}] and run.exit == 0
    assert run.malformed == "a record that is not one flat JSON object"  # the garbled line: the program's fault
    with pytest.raises(CodeSandboxError, match="could not be set up: mount /tmp"):
        parse_report(b'E {"setup_error": "mount /tmp"}\n', b"", 3, 1)
    with pytest.raises(CodeSandboxError, match="after 0 of 1 runs: Traceback"):
        parse_report(b"", b"Traceback\nboom", 1, 1)


def test_summary_counts_passes_and_names_the_first_failure() -> None:
    res = summarize([CaseOutcome(True), CaseOutcome(-3, "timeout", "case 1: timed out"), CaseOutcome(True)], "x", 3)
    assert (res.score, res.passed, res.total, res.status, res.error) == (2 / 3, 2, 3, "timeout", "case 1: timed out")
    keys = {"score", "acc", "passed", "total", "code_status", "code_error", "code_backend", "tripwire"}
    assert set(res.as_dict()) == keys
    assert summarize([], "x", 0).score == 0.0


# -- SandboxFusion answers ------------------------------------------------------------------
def _run(status: str, rc: int | None = 0, out: str = "", err: str = "") -> dict[str, Any]:
    return {"status": status, "return_code": rc, "stdout": out, "stderr": err}


@pytest.mark.parametrize(
    ("answer", "code", "status"),
    [
        ({"status": "Success", "run_result": _run("Finished", out="3\n")}, True, "passed"),
        ({"status": "Success", "run_result": _run("Finished", out="4\n")}, False, "wrong_answer"),
        ({"status": "Failed", "run_result": _run("TimeLimitExceeded", None)}, -3, "timeout"),
        ({"status": "Failed", "run_result": _run("Finished", 1, err="Traceback\nKeyError: 1")}, -2, "runtime_error"),
        (
            {"status": "Failed", "compile_result": _run("Finished", 1, err="error: x"), "run_result": None},
            -4,
            "compile_error",
        ),
        ({"status": "Failed", "compile_result": _run("TimeLimitExceeded", None)}, -4, "compile_error"),
        ({"status": "SandboxError", "message": "pod died"}, -1, "sandbox_error"),
        ({"status": "Weird"}, -1, "sandbox_error"),
    ],
)
def test_classify_reads_answers_as_verl(answer: dict[str, Any], code: int, status: str) -> None:
    outcome = classify(answer, "3\n")
    assert (outcome.code, outcome.status) == (code, status)


class _CannedClient:
    def __init__(self, answers: Iterable[dict[str, Any]]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, str | None, dict[str, Any]]] = []

    async def run_code(self, code: str, stdin: str | None, **kw: Any) -> dict[str, Any]:
        self.calls.append((code, stdin, kw))
        return self.answers.pop(0)


async def test_a_compile_error_counts_for_every_later_case_and_only_ten_count() -> None:
    ok = {"status": "Success", "run_result": _run("Finished", out="1\n")}
    bad = {"status": "Failed", "compile_result": _run("Error", 1)}
    gt = {"inputs": ["x"] * 12, "outputs": ["1\n"] * 12}
    client = _CannedClient([ok, bad] + [ok] * 8)
    res = await score_sandbox_fusion(client, "```python\nprint(1)\n```", gt, memory_limit_mb=77)  # type: ignore[arg-type]  # a stand-in client
    assert (res.passed, res.total, res.status) == (1, 10, "compile_error")
    assert len(client.calls) == 10 and client.calls[0][2]["memory_limit_mb"] == 77


async def test_a_failing_request_fails_the_whole_response() -> None:
    class Down:
        async def run_code(self, *a: Any, **kw: Any) -> None:
            raise SandboxUnavailableError("SandboxFusion at http://x/run_code failed 3 times")

    with pytest.raises(SandboxUnavailableError, match="http://x/run_code"):
        await score_sandbox_fusion(Down(), "```python\nprint(1)\n```", {"inputs": ["", ""], "outputs": ["1", "1"]})  # type: ignore[arg-type]  # a stand-in client
