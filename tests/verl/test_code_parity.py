"""Parity with verl 0.9.1's own code scorers (runs only in the verl environment).

Every case of :mod:`tests.verl.code_cases` is scored twice, by
``verl.utils.reward_score.default_compute_score`` and by rewardq's default scorer, and the
scores must be equal:

* without a sandbox URL: rewardq's local runner (each program isolated) against verl's
  ``prime_code`` (which runs the program in a fork of the scoring process);
* with a SandboxFusion URL (the local stand-in): rewardq's async client against verl's
  ``sandbox_fusion`` module, both talking to the same server.

verl's side runs in a pool of separate processes, ours concurrently in the event loop. The pool
serves the module's three tests, its processes forked from a fork server that imported this module
(verl, torch) once: each spawned process imported them on its own before (12 imports of ~15 s CPU
each on a 2-core machine, the most of this file's time), and a fork server's children are as clean
(nothing forked from pytest or the event loop) and hold the same modules as a spawned process that
unpickled :func:`_verl` from here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from verl.utils.reward_score import default_compute_score as verl_compute_score

from rewardq.reward.codeexec.runtime import CodeRuntime
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.scoring import compute_score_async
from tests.support.checks import detailed
from tests.support.sandbox_standin import Standin
from tests.verl.code_cases import CASES, IMPORT_CASES, CodeCase

pytestmark = pytest.mark.timeout(900)


def _fork_children() -> None:
    """In a spawned pool worker, multiprocessing defaults to spawn; verl's prime_code expects
    the Linux default (fork) for its per-case processes, as in a verl trainer."""
    multiprocessing.set_start_method("fork", force=True)


def _verl(case: CodeCase, url: str | None) -> float:
    return float(
        verl_compute_score(
            case.data_source,
            case.completion,
            case.ground_truth,
            sandbox_fusion_url=url,
            concurrent_semaphore=None,
            memory_limit_mb=1024,
        )
    )


@pytest.fixture(scope="module")
def verl_pool() -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    """verl's side: 4 processes forked from a fork server that imported this module (see above)."""
    ctx = multiprocessing.get_context("forkserver")  # a clean process per worker: nothing forked from the event loop
    ctx.set_forkserver_preload([__name__])
    with concurrent.futures.ProcessPoolExecutor(max_workers=4, mp_context=ctx, initializer=_fork_children) as pool:
        yield pool


async def _both(
    pool: concurrent.futures.ProcessPoolExecutor, cases: list[CodeCase], settings: CodeExecSettings
) -> tuple[list[float], list[dict[str, Any]]]:
    loop = asyncio.get_running_loop()
    theirs = [loop.run_in_executor(pool, _verl, c, settings.sandbox_fusion_url) for c in cases]
    runtime = CodeRuntime(settings)
    try:
        ours = await asyncio.gather(
            *(compute_score_async(c.data_source, c.completion, c.ground_truth, code_runtime=runtime) for c in cases)
        )
    finally:
        await runtime.close()
    return list(await asyncio.gather(*theirs)), [detailed(o) for o in ours]


def _assert_same(cases: list[CodeCase], theirs: list[float], ours: list[dict[str, Any]]) -> None:
    diffs = [
        (c.name, t, o["score"], o["code_status"], o["code_error"])
        for c, t, o in zip(cases, theirs, ours)
        if t != o["score"]
    ]
    assert not diffs, "\n".join(map(str, diffs))


async def test_local_runner_scores_as_verl_prime_code(verl_pool: concurrent.futures.ProcessPoolExecutor) -> None:
    # Given >= 30 problems in both modes, from right to timed out
    assert len(CASES) >= 30
    assert sum("fn_name" in c.ground_truth for c in CASES) >= 12
    # When verl's prime_code and rewardq's local runner score every one of them
    theirs, ours = await _both(verl_pool, CASES, CodeExecSettings(code_local_max_concurrent=4))
    # Then the scores are identical, case by case
    _assert_same(CASES, theirs, ours)
    # and the cases really span right, wrong, partial and every kind of failure
    assert {o["code_backend"] for o in ours} == {"local"}
    statuses = {o["code_status"] for o in ours}
    assert {"passed", "wrong_answer", "compile_error", "runtime_error", "timeout", "invalid_test_cases"} <= statuses
    assert sum(0.0 < t < 1.0 for t in theirs) >= 5
    assert sum(t == 1.0 for t in theirs) >= 10 and sum(t == 0.0 for t in theirs) >= 10


async def test_programs_that_import_numpy_and_the_standard_library_score_as_in_verl(
    verl_pool: concurrent.futures.ProcessPoolExecutor,
) -> None:
    # Given right programs using numpy and the standard library (and a few verl's guard blocks)
    assert sum("numpy" in c.name for c in IMPORT_CASES) >= 5 and len(IMPORT_CASES) >= 20
    # When verl's prime_code and rewardq's local runner (namespaces: the interpreter under a 0700 home
    # is bound back read-only) score them
    theirs, ours = await _both(verl_pool, IMPORT_CASES, CodeExecSettings(code_local_max_concurrent=4))
    # Then the scores are identical: numpy imports past the guard as it does in verl, and so do the
    # modules verl's process holds; what verl's guard blocks (subprocess, ctypes, os.putenv) fails alike
    _assert_same(IMPORT_CASES, theirs, ours)
    assert sum(t == 1.0 for t in theirs) >= 15
    blocked = {c.name: o for c, o in zip(IMPORT_CASES, ours) if c.name.endswith(("-blocked", "-guarded"))}
    assert all(o["score"] == 0.0 for o in blocked.values()), blocked


async def test_sandbox_fusion_client_scores_as_verl(
    verl_pool: concurrent.futures.ProcessPoolExecutor, tmp_path: Path
) -> None:
    # Given a SandboxFusion stand-in and the cases that do not time out (its timeout is verl's 10 s)
    standin = Standin(tmp_path)
    cases = [c for c in CASES if "timeout" not in c.name]
    try:
        # When verl's sandbox_fusion module and rewardq's client score them against it
        theirs, ours = await _both(verl_pool, cases, CodeExecSettings(sandbox_fusion_url=standin.url))
    finally:
        standin.stop()
    # Then the scores are identical
    _assert_same(cases, theirs, ours)
    assert {o["code_backend"] for o in ours} == {"sandbox_fusion"}
    assert sum(0.0 < t < 1.0 for t in theirs) >= 5
