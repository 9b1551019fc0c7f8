"""``assert_case`` tests with the local runner: scored as SandboxFusion scores them, with tripwires.

verl's SandboxFusion path runs ``program + "\\n\\n" + assert_case[i]`` per case (with ``inputs[i]``
on stdin; for ``fn_name`` problems inside its call wrapper, which then prints the function's
result) and passes a case when the script exits 0 and its stdout matches ``outputs[i]`` (any
stdout when that is None); the score is the fraction of the first 10 cases passed. verl's
``prime_code`` knows no ``assert_case`` (it scores such problems 0.0), so the local runner
follows SandboxFusion here, with one difference on purpose: **a case passes only when the harness
saw every assertion run and hold**, not when the process exits 0. The sandbox side is
:mod:`.harness_asserts`; the tripwires are :mod:`.harness_wires`.

A run that trips a wire scores the whole response 0.0, with ``code_status`` ``tripwire`` and
``tripwire`` naming the hack (counted per data source in ``rewardq status``, ``rewardq top`` and
``/metrics``). Two are decided here, from what the supervisor saw:

* ``early_exit``: the runner ended with exit code 0 (``os._exit``, an ``exec``'d program) or by
  SIGSYS (a signal to itself: the syscall filter turns it into SIGSYS) before the harness's
  report, or the program called ``sys.exit(0)`` before the assertions and they did not hold
  (SandboxFusion would have passed it);
* ``forged_report``: lines on the report pipe without the run's token, or a second report.
"""

from __future__ import annotations

from typing import Any

from rewardq.reward.codeexec.cases import TestCases, extract_fenced_code, preamble
from rewardq.reward.codeexec.report import RunReport, clean_text
from rewardq.reward.codeexec.result import CODE_MAX_CASES, PASSED, CaseOutcome, CodeResult, died_outcome, summarize
from rewardq.reward.codeexec.sandbox import LocalSandbox, Program, RunSpec
from rewardq.reward.codeexec.settings import CodeExecSettings

BACKEND = "local"


def has_assertions(tc: TestCases) -> bool:
    """Whether ``tc`` is graded by assertions (an ``assert_case`` list with any text): else the
    local runner scores it as ``prime_code`` does."""
    return tc.assert_case is not None and any(str(a).strip() for a in tc.assert_case)


class _Tripped(Exception):
    def __init__(self, wire: str, detail: str) -> None:
        super().__init__(detail)
        self.wire, self.detail = wire, detail


def _ended_early(run: RunReport, case: int, timeout: int, memory_mb: int) -> CaseOutcome:
    """A run that ended before the harness's report: a hack when it ended itself on purpose."""
    if not run.timed_out and not run.overflow:
        if run.signal == "SIGSYS":
            raise _Tripped("early_exit", "the program sent itself a signal (or exec'd) before the assertions finished")
        if run.signal is None and run.exit == 0:
            raise _Tripped("early_exit", "the program ended its process (exit code 0) before the assertions finished")
    return died_outcome(run, case, timeout, memory_mb)


def judge(run: RunReport, case: int, expected: object, timeout: int, memory_mb: int) -> CaseOutcome:
    """One case's outcome from its run's report.

    Raises:
        _Tripped: the run tripped a wire (the harness reported one, or it is one of those above).
    """
    for rec in run.records:
        if "tripwire" in rec:
            raise _Tripped(rec["tripwire"], clean_text(rec.get("detail", ""), 300))
    if run.malformed:
        raise _Tripped("forged_report", f"the program wrote {run.malformed} on its report pipe")
    mine = [r for r in run.records if r.get("case") == case]
    done = [r for r in run.records if "done" in r]
    if len(mine) > 1 or len(done) > 1:
        raise _Tripped("forged_report", "a second report for one run")
    if not mine or not done:
        return _ended_early(run, case, timeout, memory_mb)
    rec = mine[0]
    if rec.get("overflow"):
        return CaseOutcome(False, "output_limit", f"case {case}: printed more than the output limit")
    if "load_error" in rec:
        why = clean_text(rec["load_error"])
        if why.startswith(("SyntaxError", "IndentationError", "TabError")):
            return CaseOutcome(-2, "compile_error", f"case {case}: the program does not compile: {why}")
        return CaseOutcome(-1, "runtime_error", f"case {case}: {why}")
    outcome = _verdict(rec, case, expected)
    if not outcome.passed and rec.get("exited"):
        raise _Tripped(
            "early_exit",
            f"the program called {clean_text(rec['exited'], 40)} before the assertions, which then failed "
            "(SandboxFusion would have passed it)",
        )
    return outcome


def _verdict(rec: dict[str, Any], case: int, expected: object) -> CaseOutcome:
    if "error" in rec:
        return CaseOutcome(-1, "runtime_error", f"case {case}: {clean_text(rec['error'])}")
    if not rec.get("held") or "failed" in rec:
        why = clean_text(rec.get("failed", "an assertion failed"))
        return CaseOutcome(False, "wrong_answer", f"case {case}: {why}")
    ran, total = rec.get("ran", 0), rec.get("asserts", 0)
    if ran < total:
        return CaseOutcome(False, "wrong_answer", f"case {case}: {total - ran} of {total} assertions never ran")
    printed = rec.get("out", "")
    if expected is not None and str(printed).rstrip("\n") != str(expected).rstrip("\n"):
        return CaseOutcome(False, "wrong_answer", f"case {case}: wrong output")
    return PASSED


async def score_asserts(
    sandbox: LocalSandbox,
    completion: str,
    tc: TestCases,
    *,
    timeout: float = CodeExecSettings.code_local_case_timeout,
    max_cases: int = CODE_MAX_CASES,
) -> CodeResult:
    """Score ``completion`` against ``tc``'s assertions (see the module docstring).

    Raises:
        CodeSandboxError: the sandbox failed (not the program).
    """
    code = extract_fenced_code(completion)
    if code is None:
        return CodeResult(0.0, 0, 0, "no_code", "Invalid completion (missing code block)", BACKEND)
    tests = [str(a) for a in tc.assert_case or []]
    n = len(tests)
    if len(tc.inputs) != n or len(tc.outputs) != n:
        bad = CaseOutcome(-1, "invalid_test_cases", "inputs, outputs and assert cases differ in number")
        return summarize([bad] * n, BACKEND, 0, counted=max_cases)
    counted = min(n, max_cases)
    module = "import traceback\n" + preamble() + code if tc.fn_name else code  # SandboxFusion's call wrapper
    inputs = [None if x is None else str(x) for x in tc.inputs]
    seconds = max(1, int(-(-timeout // 1)))
    specs = [RunSpec([i], seconds, seconds + 1.0) for i in range(counted)]
    reports = await sandbox.execute(Program(module, tc.fn_name, False, inputs, tests=tests), specs)
    outcomes = []
    for i, run in enumerate(reports):
        try:
            outcomes.append(judge(run, i, tc.outputs[i], seconds, sandbox.limits.memory_mb))
        except _Tripped as wire:
            return CodeResult(0.0, 0, counted, "tripwire", f"case {i}: {wire.detail}", BACKEND, counted, wire.wire)
    return summarize(outcomes, BACKEND, runs=counted)
