"""A reward function for tests/verl that fails on purpose: it raises for a response marked ``FAIL``.

Any other response scores the number of ``a`` in it, divided by 4, so the samples of a group get
different rewards (GRPO's standard deviation is not 0).
"""

from __future__ import annotations

from typing import Any


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float:
    if "FAIL" in solution_str:
        raise RuntimeError("this response is marked to fail")
    return solution_str.count("a") / 4.0
