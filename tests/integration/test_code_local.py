"""The local runner in-process: both isolation modes, clean-up on cancellation, and the
built-in managers that reach it (``remote`` awaits code in the event loop, not in its pool)."""

from __future__ import annotations

import asyncio
import glob
import json
import logging
import os
import subprocess
import sys
from typing import Any

import pytest
from tensordict import TensorDict

from rewardq.errors import CodeSandboxError
from rewardq.reward.codeexec.cases import prime_module_source
from rewardq.reward.codeexec.harness_fs import closed_folder, interpreter_prefixes
from rewardq.reward.codeexec.runtime import CodeRuntime
from rewardq.reward.codeexec.sandbox import HARNESS, LocalSandbox, Program, RunSpec, parse_report
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.factory import build_manager
from rewardq.reward.scoring import compute_score_async
from tests.support.checks import detailed, single
from tests.support.helpers import until
from tests.support.records import TOK, trajectory_batch

pytestmark = pytest.mark.timeout(300)

SQUARES = json.dumps({"inputs": ["1\n", "2\n", "3\n"], "outputs": ["1\n", "4\n", "9\n"]})
PROGRAMS = {
    "right": ("n = int(input())\nprint(n * n)", 1.0, "passed"),
    "partial": ("n = int(input())\nprint(n * n if n < 3 else 0)", 2 / 3, "wrong_answer"),
    "loop": ("while True:\n    pass", 0.0, "timeout"),
}
FAST: dict[str, Any] = dict(code_local_first_pass_timeout=1, code_local_case_timeout=1)


def _harness_processes() -> list[str]:
    """This test process's sandboxes (its descendants running the harness): the other xdist workers'
    tests, and the worker processes they start, run sandboxes of their own meanwhile."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True).stdout
    rows = [ln.split(None, 2) for ln in out.splitlines() if len(ln.split(None, 2)) == 3]
    parent = {int(pid): int(ppid) for pid, ppid, _ in rows}

    def mine(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return [f"{pid} {args}" for pid, _, args in rows if HARNESS in args and mine(int(pid))]


async def _score_all(runtime: CodeRuntime) -> dict[str, dict[str, Any]]:
    results = await asyncio.gather(
        *(compute_score_async("taco", p, SQUARES, code_runtime=runtime) for p, _, _ in PROGRAMS.values())
    )
    return dict(zip(PROGRAMS, (detailed(r) for r in results)))


# rlimits as root needs an interpreter other users can read: tests/integration/test_code_modes.py
# runs it through worker processes that see one; here the interpreter may sit under a 0700 home
RLIMITS_HERE = ["rlimits"] if os.geteuid() != 0 or not any(map(closed_folder, interpreter_prefixes())) else []


@pytest.mark.parametrize("isolation", ["namespaces", *RLIMITS_HERE])
async def test_both_isolation_modes_score_alike_and_leave_nothing_behind(
    isolation: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a runtime with the isolation forced
    before = set(glob.glob("/tmp/rewardq-code-*"))
    runtime = CodeRuntime(CodeExecSettings(code_local_isolation=isolation, **FAST))
    # When it scores a right, a partly right and a looping program
    with caplog.at_level(logging.INFO, logger="rewardq.reward.codeexec"):
        results = await _score_all(runtime)
    # Then the scores are the same in both modes
    for name, (_, score, status) in PROGRAMS.items():
        assert (results[name]["score"], results[name]["code_status"]) == (pytest.approx(score), status), results[name]
    # ... the mode is the one asked for (rlimits warns what it does not isolate)
    assert runtime.sandbox().isolation == isolation
    if isolation == "rlimits":
        assert "CAN open network connections" in caplog.text
    # ... and no work dir or process is left
    assert set(glob.glob("/tmp/rewardq-code-*")) == before
    assert not _harness_processes()
    await runtime.close()


async def test_a_cancelled_scoring_kills_its_sandbox() -> None:
    # Given a program that would run for 10 s per pass
    runtime = CodeRuntime(CodeExecSettings(code_local_first_pass_timeout=10))
    await runtime.sandbox().start()  # the probe program has run and gone
    task = asyncio.create_task(compute_score_async("apps", "while True:\n    pass", SQUARES, code_runtime=runtime))
    await until(_harness_processes, "the program's sandbox to start", 5.0)
    # When its scoring is cancelled (worker shutdown, score_timeout)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Then the whole sandbox is gone: within 3 s, well inside the 10 s its program would still run (the
    # kill is sent as the task ends; a loaded machine may take a moment to reap the killed processes)
    await until(lambda: not _harness_processes(), "the cancelled scoring's sandbox to be gone", 3.0)


def _batch(program: str, data_source: str = "codeforces") -> TensorDict:
    sample = {"data_source": data_source, "reward_model": {"ground_truth": SQUARES}, "extra_info": {}}
    return trajectory_batch(f"```python\n{program}\n```", sample=sample, prompt="Square it.", eos=True)


@pytest.mark.parametrize("manager", ["naive", "dapo", "gdpo", "limited", "remote"])
async def test_builtin_managers_score_code_with_the_worker_runtime(manager: str) -> None:
    # Given a built-in manager configured through options, as the worker builds it
    m = build_manager(manager, tokenizer=TOK, options={**FAST, "sandbox_fusion_memory_limit_mb": 256})
    await m.setup()
    try:
        # When it scores a partly right program
        out = single(await m.run_single(_batch(PROGRAMS["partial"][0])))
    finally:
        await m.close()
        await m.context.aclose()
    # Then the default scorer ran it in the local sandbox, counted under its data source
    assert out["reward_score"] == pytest.approx(2 / 3)
    assert out["reward_extra_info"]["code_status"] == "wrong_answer"
    assert m.context.code_stats.snapshot()["codeforces"]["trajectories"] == 1
    if manager == "remote":  # awaited in the event loop: nothing went to the process pool
        assert m.stats()["tasks"] == 0  # type: ignore[attr-defined]  # every built-in manager has stats()


def test_a_runner_that_cannot_isolate_itself_is_a_sandbox_error_not_a_score() -> None:
    # Given a job whose runner cannot enter its work dir (isolation fails before the program runs)
    program = Program(prime_module_source("print(1)", None), None, False, [""])
    job = LocalSandbox(isolation="rlimits")._job(program, [RunSpec([0], 5, 6.0)], "rlimits", "/nonexistent-workdir")
    done = subprocess.run(
        [sys.executable, "-I", "-B", HARNESS], input=json.dumps(job).encode(), capture_output=True, timeout=60
    )
    # Then the report says the sandbox failed (the worker gives an error result, not a reward)
    with pytest.raises(CodeSandboxError, match="could not isolate a program: FileNotFoundError"):
        parse_report(done.stdout, done.stderr, done.returncode, 1)


@pytest.mark.skipif(
    os.geteuid() != 0 or not any(map(closed_folder, interpreter_prefixes())),
    reason="needs root and an interpreter under a folder other users cannot enter (pyenv in /root)",
)
async def test_rlimits_as_root_refuses_an_interpreter_its_programs_cannot_read() -> None:
    # Given rlimits as root, with this interpreter under a 0700 folder (the programs' uid cannot read it)
    runtime = CodeRuntime(CodeExecSettings(code_local_isolation="rlimits", **FAST))
    # When a correct program that imports a module from the library's files arrives
    with pytest.raises(CodeSandboxError) as refused:
        await compute_score_async("taco", "import array\nprint(int(input()) ** 2)", SQUARES, code_runtime=runtime)
    # Then it is refused (an error result, never a 0.0) naming the folder and the fixes
    closed = next(c for c in map(closed_folder, interpreter_prefixes()) if c)
    for text in (f"{closed} is closed to other users", "install the interpreter", "sandbox_fusion_url"):
        assert text in str(refused.value)
    await runtime.close()
