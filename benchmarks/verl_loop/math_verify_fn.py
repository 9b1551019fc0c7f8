"""The math-verify reward function both systems run as their custom reward function.

verl loads it with ``reward.custom_reward_function.path`` (this file) and calls it in its
reward-loop worker's thread pool; rewardq loads it with ``--reward-fn`` and calls it in scorer
processes. math-verify's own timeouts use ``signal.alarm``, which raises in a thread
(docs/TRAPS: every call would fail in verl), so they are off here: the same function, correct
in both systems.
"""

from __future__ import annotations

import logging
from typing import Any

logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" on every call


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    """1.0 when the response's final answer is equivalent to ``ground_truth`` (LaTeX), else 0.0."""
    from math_verify import parse, verify

    gold = parse(f"${ground_truth}$", parsing_timeout=None)
    pred = parse(solution_str, parsing_timeout=None)
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0
