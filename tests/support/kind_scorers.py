"""A ``--reward-fn`` that fails as its response asks, else scores as verl's default does.

Loaded by real worker processes (``--reward-fn tests/support/kind_scorers.py:compute_score``) and run
in their scorer processes: ``raise`` in the response raises ValueError (failure kind ``scorer``),
``hang`` sleeps an hour (past ``score_timeout``: ``timeout``); any other response is scored by
:func:`rewardq.reward.scoring.default_compute_score`, which knows no data source such as
``no-such-source`` (``config``, raised in the scorer process and kept across the hop).
"""

from __future__ import annotations

import time
from typing import Any

from rewardq.reward.scoring import default_compute_score


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any:
    if "raise" in solution_str:
        raise ValueError("the reward function cannot read this response")
    if "hang" in solution_str:
        time.sleep(3600)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
