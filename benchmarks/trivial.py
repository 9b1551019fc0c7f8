"""The trivial scorer as a rewardq manager, for ``python -m benchmarks --scorer trivial``.

The issue's reference numbers were taken with a trivial scorer, so that what is compared
is each system's own cost around the scoring. With this manager a rewardq worker still does
everything it always does (read, decode and validate every record, claim, assemble, build
the ``TensorDict`` batch of what the manager reads (the final row, as for the built-in
managers), call the manager, write every key's result, ack);
only the manager's work shrinks to reading the final row's response length.
"""

from __future__ import annotations

from typing import Any

from benchmarks.workload import trivial_score
from rewardq.reward.base import RewardManager
from rewardq.reward.rows import last_row, valid_response_ids


class TrivialManager(RewardManager):
    """``reward_score`` = :func:`benchmarks.workload.trivial_score` of the final output."""

    reads = "final"  # run_single reads data[-1:] only, as the built-in managers do

    async def run_single(self, data: Any) -> dict[str, Any]:
        n = int(valid_response_ids(last_row(data)).shape[0])
        return {"reward_score": trivial_score(n), "reward_extra_info": {}}
