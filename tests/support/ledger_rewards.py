"""Reward functions for the ledger's tests: the default scorers, a custom data source, some errors.

``compute_score`` scores ``openai/gsm8k`` and ``lighteval/MATH`` with the default scorers, the
custom data source ``custom/length`` by its own rule, and raises for ``custom/raise`` (an error
result). ``compute_score_v2`` is the same except on a known subset: the GSM8K samples whose
``extra_info["index"]`` is a multiple of 4 score 0.5 more, and every ``custom/length`` sample
scores 1.0 - its old score. Replaying a ledger with it changes exactly those rewards.
"""

from __future__ import annotations

import time
from typing import Any

from rewardq.reward.scoring import default_compute_score

CUSTOM = "custom/length"
FAILING = "custom/raise"


def _custom(solution_str: str) -> float:
    return (len(solution_str) % 7) / 7.0


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any:
    if data_source == CUSTOM:
        return _custom(solution_str)
    if data_source == FAILING:
        raise ValueError(f"no score for {ground_truth!r}")
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)


def changed(data_source: str, extra_info: Any) -> bool:
    """Whether ``compute_score_v2`` scores this sample differently."""
    index = (extra_info or {}).get("index", -1) if isinstance(extra_info, dict) else -1
    return data_source == CUSTOM or (data_source == "openai/gsm8k" and isinstance(index, int) and index % 4 == 0)


def compute_score_v2(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any:
    if data_source == CUSTOM:
        return 1.0 - _custom(solution_str)
    base = compute_score(data_source, solution_str, ground_truth, extra_info)
    if changed(data_source, extra_info):
        return float(base) + 0.5
    return base


def compute_score_slow(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any:
    """``compute_score``, 0.2 s later: a replay that is still running when a test interrupts it."""
    time.sleep(0.2)
    return compute_score(data_source, solution_str, ground_truth, extra_info)
