"""The local runner: verl's ``prime_code`` scoring, with every program in the local sandbox.

``prime_code`` with ``continuous=True`` (what verl's ``default_compute_score`` uses) scores in
two passes, and so does :func:`score_local`:

1. **All cases in one process**, each case under a 5 s alarm, the whole run under 6 s. If
   every case passes, the score is 1.0 (also for a problem with no cases, if the program loads).
2. Otherwise **each of the first 10 cases in a process of its own** (10 s alarm, 11 s run);
   the score is the fraction of them that pass.

Quirks of ``prime_code`` kept so scores stay identical (documented in docs/code-execution.md):
the second pass drops ``fn_name``, so a call-based program that failed the first pass is then
run as a standard-input program (and rarely prints the expected JSON); a case whose program
dies (timeout, crash, ``os._exit``) takes the whole run with it (every case of that run
fails); the first pass stops judging at the first failing case.

How a run's records become verl's per-case results (``True``, ``False``, ``-1``, ``-2``) is
:func:`run_outcomes`. Problems graded by ``assert_case`` (which ``prime_code`` cannot run) are
scored as SandboxFusion scores them, with tripwires: :mod:`.asserts`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rewardq.reward.codeexec.asserts import has_assertions, score_asserts
from rewardq.reward.codeexec.cases import (
    InvalidTestCases,
    extract_prime_code,
    parse_test_cases,
    prime_module_source,
)
from rewardq.reward.codeexec.compare import CaseAbort, call_verdict, decode_value, expected_for_case, stdin_verdict
from rewardq.reward.codeexec.report import RunReport, clean_text
from rewardq.reward.codeexec.result import CODE_MAX_CASES, PASSED, CaseOutcome, CodeResult, died_outcome, summarize
from rewardq.reward.codeexec.sandbox import LocalSandbox, Program, RunSpec
from rewardq.reward.codeexec.settings import CodeExecSettings

BACKEND = "local"


def _verdict(record: Mapping[str, object], expected: Any, call_based: bool) -> bool:
    if call_based:
        value = record.get("value")
        if not isinstance(value, str):
            return False
        try:
            return call_verdict(decode_value(value), expected)
        except ValueError:
            return False
    printed = record.get("out")
    return isinstance(printed, str) and stdin_verdict(printed, expected)


def run_outcomes(
    run: RunReport, spec: RunSpec, outputs: Sequence[object], call_based: bool, memory_mb: int
) -> list[CaseOutcome]:
    """verl's result list for one run, from what the sandboxed program reported.

    ``[-2]`` when the program does not load; otherwise one outcome per case up to and
    including the first that is not a pass; every case ``-1`` when the run ends before a
    verdict (its process died, or ``prime_code`` would have aborted the run).
    """
    if run.malformed:  # it tampered with its own report: the run fails, as one that dies does
        return [died_outcome(run, spec.cases[0] if spec.cases else 0, spec.timeout, memory_mb)] * len(spec.cases)
    by_case: dict[int, dict[str, Any]] = {}
    for rec in run.records:
        if "load_error" in rec:
            return [CaseOutcome(-2, "compile_error", f"the program does not load: {clean_text(rec['load_error'])}")]
        case = rec.get("case")
        if isinstance(case, int) and case not in by_case:
            by_case[case] = rec
    outcomes: list[CaseOutcome] = []
    for i in spec.cases:
        try:
            expected = expected_for_case(outputs[i], call_based)
        except CaseAbort as exc:
            return [CaseOutcome(-1, "aborted", f"case {i}: {exc}")] * len(spec.cases)
        record = by_case.get(i)
        if record is None:
            return [died_outcome(run, i, spec.timeout, memory_mb)] * len(spec.cases)
        if "abort" in record:
            return [CaseOutcome(-1, "aborted", f"case {i}: {clean_text(record['abort'])}")] * len(spec.cases)
        if "error" in record:
            outcomes.append(CaseOutcome(-1, "runtime_error", f"case {i}: {clean_text(record['error'])}"))
            return outcomes
        if "overflow" in record:
            outcomes.append(CaseOutcome(False, "output_limit", f"case {i}: printed more than the output limit"))
            return outcomes
        try:
            ok = _verdict(record, expected, call_based)
        except Exception as exc:  # noqa: BLE001 - a comparison prime_code cannot make kills its run
            return [CaseOutcome(-1, "aborted", f"case {i}: cannot compare ({type(exc).__name__})")] * len(spec.cases)
        if not ok:
            outcomes.append(CaseOutcome(False, "wrong_answer", f"case {i}: wrong answer"))
            return outcomes
        outcomes.append(PASSED)
    if run.exit != 0 or not any("done" in rec for rec in run.records):
        # every case passed, yet the process did not finish cleanly: prime_code loses such a run's
        # results (a program cannot keep passes it wrote on the report pipe itself, then hang)
        return [died_outcome(run, spec.cases[-1] if spec.cases else 0, spec.timeout, memory_mb)] * len(spec.cases)
    return outcomes


def _timeout(seconds: float) -> int:
    return max(1, int(-(-seconds // 1)))  # signal.alarm takes whole seconds


async def score_local(
    sandbox: LocalSandbox,
    completion: str,
    ground_truth: object,
    *,
    first_pass_timeout: float = CodeExecSettings.code_local_first_pass_timeout,
    case_timeout: float = CodeExecSettings.code_local_case_timeout,
    max_cases: int = CODE_MAX_CASES,
) -> CodeResult:
    """Score ``completion`` against ``ground_truth`` as verl's ``prime_code`` (continuous) does.

    Raises:
        CodeSandboxError: the sandbox failed (not the program).
    """
    try:
        graded = parse_test_cases(ground_truth)
    except InvalidTestCases:
        graded = None
    if graded is not None and has_assertions(graded):  # SandboxFusion's format: prime_code scores it 0.0
        return await score_asserts(sandbox, completion, graded, timeout=case_timeout, max_cases=max_cases)
    code = extract_prime_code(completion)
    try:
        tc = parse_test_cases(ground_truth, assert_cases=False)
        if len(tc.outputs) < len(tc.inputs):
            raise InvalidTestCases(f"{len(tc.inputs)} inputs but only {len(tc.outputs)} outputs")
    except InvalidTestCases as exc:
        return CodeResult(0.0, 0, 0, "invalid_test_cases", str(exc), BACKEND)
    memory = sandbox.limits.memory_mb
    call_based = tc.fn_name is not None
    first_program = Program(
        prime_module_source(code, tc.fn_name), tc.fn_name, call_based and "class Solution" in code, tc.inputs
    )
    first = await _first_pass(sandbox, first_program, tc.outputs, _timeout(first_pass_timeout), memory)
    if all(o.passed for o in first):
        return CodeResult(1.0, len(tc.inputs), len(tc.inputs), "passed", "", BACKEND, runs=1)
    # second pass: prime_code builds these cases without fn_name, so they run on stdin; for a
    # standard-input problem that is the first pass's program (its module is not built again)
    timeout = _timeout(case_timeout)
    specs = [RunSpec([i], timeout, timeout + 1.0) for i in range(min(len(tc.inputs), max_cases))]
    program = Program(prime_module_source(code, None), None, False, tc.inputs) if call_based else first_program
    reports = await sandbox.execute(program, specs)
    outcomes = [o for spec, run in zip(specs, reports) for o in run_outcomes(run, spec, tc.outputs, False, memory)]
    return summarize(outcomes, BACKEND, runs=1 + len(specs))


async def _first_pass(
    sandbox: LocalSandbox, program: Program, outputs: list[object], timeout: int, memory: int
) -> list[CaseOutcome]:
    spec = RunSpec(list(range(len(program.inputs))), timeout, timeout + 1.0)
    [report] = await sandbox.execute(program, [spec])
    return run_outcomes(report, spec, outputs, program.fn_name is not None, memory)
