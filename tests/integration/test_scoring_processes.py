"""math-verify in a process pool, where its signal.alarm timeouts work."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from tests.unit.test_scoring import MATH_VERIFY_CASES, _score_case


def test_math_verify_in_a_process_pool() -> None:
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        results = list(pool.map(_score_case, MATH_VERIFY_CASES))
    assert results == [expected for _, _, expected in MATH_VERIFY_CASES]
    assert all(type(r) is float for r in results)
