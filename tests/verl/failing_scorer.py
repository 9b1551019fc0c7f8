"""A reward function for tests/verl that fails on purpose: it raises for a response marked ``FAIL``.

Any other response of the data source ``custom`` scores the number of ``a`` in it, divided by 4, so
the samples of a group get different rewards (GRPO's standard deviation is not 0); every other data
source scores as rewardq's default scorers score it (verl's ``default_compute_score``), and an
unknown one raises ``UnknownDataSourceError`` as the default scorers do (a ``config`` failure).
"""

from __future__ import annotations

from typing import Any

from rewardq.reward.scoring import default_compute_score


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any) -> Any:
    if "FAIL" in solution_str:
        raise RuntimeError("this response is marked to fail")
    if data_source == "custom":
        return solution_str.count("a") / 4.0
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
