"""Where a manager's scoring functions run: the worker's ``--reward-fn-placement`` / ``--scorer-*`` settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rewardq import defaults
from rewardq.errors import ConfigError

#: Where a synchronous reward function may run (see :class:`ScoringSettings`).
REWARD_FN_PLACEMENTS = defaults.REWARD_FN_PLACEMENTS


@dataclass
class ScoringSettings:
    """Where a manager's scoring functions run (:mod:`rewardq.reward.execution.isolation`).

    Attributes:
        reward_fn: the worker's ``--reward-fn`` spec; scorer processes load the function by it.
        reward_fn_kwargs: its ``--reward-kwargs``.
        reward_fn_placement: where a synchronous reward function runs: ``process`` (default:
            scorer processes, killed on timeout), ``thread`` or ``inline`` (see docs/isolation.md).
        processes: scorer processes kept ready per function (None: one per core, at least 2).
        spare_after: seconds a busy scorer process still counts toward the pool's size.
        max_spares: spare processes at most, beyond ``processes``.
        max_lost_threads: hung calls of a thread-run function before its calls are refused.
        start_method: ``forkserver`` (Linux default) or ``spawn``.
    """

    reward_fn: str | None = None
    reward_fn_kwargs: dict[str, Any] = field(default_factory=dict)
    reward_fn_placement: str = defaults.REWARD_FN_PLACEMENT
    processes: int | None = defaults.SCORER_PROCESSES
    spare_after: float = defaults.SCORER_SPARE_AFTER
    max_spares: int = defaults.CONCURRENCY
    max_lost_threads: int = defaults.MAX_LOST_THREADS
    start_method: str | None = None

    def __post_init__(self) -> None:
        if self.reward_fn_placement not in REWARD_FN_PLACEMENTS:
            raise ConfigError(
                f"reward_fn_placement must be one of {', '.join(REWARD_FN_PLACEMENTS)}, "
                f"got {self.reward_fn_placement!r}"
            )
        if self.processes is not None and (
            isinstance(self.processes, bool) or not isinstance(self.processes, int) or self.processes < 1
        ):
            raise ConfigError(f"scorer_processes must be an integer >= 1, got {self.processes!r}")

    def process_count(self) -> int:
        """Scorer processes per function: ``processes``, or one per core (at least 2)."""
        return self.processes or max(2, os.cpu_count() or 2)
