"""The result of scoring one program, as both backends return it.

verl's code scorers return ``(score, metadata)`` and ``default_compute_score`` keeps only the
score, so a verl run sees ``{"acc": score}``. rewardq returns the same score plus what
happened, with the same keys for every code sample (``reward_extra_info`` keys must not
differ between the rows of a batch)::

    {"score": 0.5, "acc": 0.5, "passed": 1, "total": 2, "code_status": "wrong_answer",
     "code_error": "case 1: wrong answer", "code_backend": "local", "tripwire": ""}

``code_status`` is ``passed`` or what stopped the first failing counted case:
``wrong_answer``, ``runtime_error``, ``timeout``, ``compile_error``, ``killed``, ``exited``,
``output_limit``, ``aborted``, ``malformed_report`` (the program wrote on its report pipe),
``sandbox_error`` (SandboxFusion's own), ``no_code``, ``invalid_test_cases``, ``tripwire``
(an ``assert_case`` run caught a reward hack: ``tripwire`` names it, the score is 0.0). Text a program
wrote (an exception's message) reaches ``code_error`` only through
:func:`~rewardq.reward.codeexec.report.clean_text`: valid UTF-8, bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rewardq.reward.codeexec.report import RunReport, clean_text

#: Test cases that count toward the continuous score: the first 10, as verl counts them.
CODE_MAX_CASES = 10


#: verl's per-case codes: True passed, False wrong answer, negative numbers errors
#: (local: -1 runtime error, timeout or death, -2 does not load; SandboxFusion: -1 API/sandbox
#: error, -2 runtime error, -3 timeout, -4 compile error).
CaseCode = Any


@dataclass(frozen=True)
class CaseOutcome:
    """One test case: verl's code for it, and our name and explanation of what happened."""

    code: CaseCode
    status: str = "passed"
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.code is True


PASSED = CaseOutcome(True)


@dataclass(frozen=True)
class CodeResult:
    """The score of one response and why.

    Attributes:
        score: passed / counted cases, as verl computes it.
        passed, total: counted cases passed, and counted.
        status, error: ``code_status`` and ``code_error`` (see the module docstring).
        backend: ``"local"`` or ``"sandbox_fusion"``.
        runs: programs executed to score it (processes locally, run_code requests remotely).
        tripwire: the reward hack the local ``assert_case`` runner caught (``early_exit``,
            ``non_plain_value``, ...; see :mod:`.harness_wires`), "" when none: the score is 0.0.
    """

    score: float
    passed: int
    total: int
    status: str
    error: str
    backend: str
    runs: int = 0
    tripwire: str = ""

    def as_dict(self) -> dict[str, object]:
        """The scorer's return value (``reward_extra_info`` keeps all of it)."""
        return {
            "score": self.score,
            "acc": self.score,
            "passed": self.passed,
            "total": self.total,
            "code_status": self.status,
            "code_error": self.error,
            "code_backend": self.backend,
            "tripwire": self.tripwire,
        }


def summarize(outcomes: list[CaseOutcome], backend: str, runs: int, *, counted: int | None = None) -> CodeResult:
    """Score the first ``counted`` outcomes (all by default): passed / counted, and the first failure.

    ``counted == 0`` scores 0.0, as verl does for an empty result list.
    """
    considered = outcomes if counted is None else outcomes[:counted]
    passed = sum(1 for o in considered if o.passed)
    total = len(considered)
    first_bad = next((o for o in considered if not o.passed), None)
    return CodeResult(
        score=passed / total if total else 0.0,
        passed=passed,
        total=total,
        status=first_bad.status if first_bad else ("passed" if total else "no_cases"),
        error=clean_text(first_bad.message, 500) if first_bad else "",  # program text: SandboxFusion's stderr too
        backend=backend,
        runs=runs,
    )


def died_outcome(run: RunReport, case: int, timeout: int, memory_mb: int) -> CaseOutcome:
    """What a run whose process ended before reporting ``case`` means for every case of it
    (``memory_mb`` is named in the hint for a crash)."""
    if run.malformed:
        return CaseOutcome(-1, "malformed_report", f"case {case}: the program wrote {run.malformed} on its report pipe")
    if run.timed_out or run.signal in ("SIGALRM", "SIGXCPU"):
        what = "ran out of CPU time" if run.signal == "SIGXCPU" else f"timed out after {timeout}s"
        return CaseOutcome(-1, "timeout", f"case {case}: {what}")
    if run.overflow:
        return CaseOutcome(-1, "output_limit", f"case {case}: printed more than the output limit")
    if run.signal:
        hint = f" (memory limit {memory_mb} MB?)" if run.signal in ("SIGSEGV", "SIGABRT", "SIGBUS") else ""
        return CaseOutcome(-1, "killed", f"case {case}: the program was killed by {run.signal}{hint}")
    return CaseOutcome(-1, "exited", f"case {case}: the program exited with code {run.exit} before finishing")
