"""Where a manager's scoring functions run: the worker's ``--reward-fn-placement`` / ``--scorer-*`` settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rewardq.errors import ConfigError

#: Where a synchronous ``--reward-fn`` runs: ``process`` (scorer processes, killed on timeout),
#: ``thread`` (threads of the worker) or ``inline`` (the worker's event loop; trusted, cheap code only).
REWARD_FN_PLACEMENT = "process"
#: Every placement ``reward_fn_placement`` accepts (see :class:`ScoringSettings`).
REWARD_FN_PLACEMENTS = ("process", "thread", "inline")
#: Scorer processes kept ready per function; None: one per CPU core, at least 2.
SCORER_PROCESSES: int | None = None
#: What one reply of a scorer process may take (its pickled result), as a multiple of
#: max_result_bytes (:func:`reply_bytes_for`), and the default when no
#: worker setting gives it: checked in the scorer process before the reply is sent.
SCORER_REPLY_FACTOR = 8
SCORER_REPLY_BYTES = 8 * 1024 * 1024
#: Seconds a scorer process may be busy on one call before it may count as stuck (no longer
#: toward the pool's size), so the calls waiting behind a hung one get a spare process instead of
#: waiting for its timeout. A call's own budget can make it sooner (``SCORER_SPARE_SHARE``).
SCORER_SPARE_AFTER = 2.0
#: Spare scorer processes per function at most, beyond ``scorer_processes``.
SCORER_SPARES = 2
#: Seconds a process beyond the pool's size stays idle before it exits (a burst that comes back
#: within that finds it ready, instead of starting and importing another).
SCORER_SPARE_IDLE = 30.0
#: Bytes of a scorer process's stdout, and of its stderr, that reach the worker's log per call;
#: the rest are counted, dropped, and the drop logged.
SCORER_OUTPUT_CAP = 64 * 1024
#: Calls of a thread-run reward function that may hang (their threads cannot be stopped)
#: before further calls are refused.
MAX_LOST_THREADS = 32


@dataclass
class ScoringSettings:
    """Where a manager's scoring functions run (:mod:`rewardq.reward.execution.isolation`).

    Attributes:
        reward_fn: the worker's ``--reward-fn`` spec; scorer processes load the function by it.
        reward_fn_kwargs: its ``--reward-kwargs``.
        reward_fn_placement: where a synchronous reward function runs: ``process`` (default:
            scorer processes, killed on timeout), ``thread`` or ``inline`` (see docs/isolation.md).
        processes: scorer processes kept ready per function (None: one per core, at least 2).
        spare_after: seconds a call may run before its scorer process may count as stuck
            (:mod:`rewardq.reward.execution.spares`).
        max_spares: spare processes at most, beyond ``processes`` (``--scorer-spares``).
        spare_idle: seconds a process beyond ``processes`` stays idle before it exits.
        output_cap: bytes of a scorer process's stdout, and of its stderr, per call in the log.
        max_lost_threads: hung calls of a thread-run function before its calls are refused.
        start_method: ``forkserver`` (Linux default) or ``spawn``.
        reply_bytes: bytes one reply of a scorer process may take (its pickled result), checked in
            the process before it is sent: :func:`reply_bytes_for` the worker's ``max_result_bytes``.
    """

    reward_fn: str | None = None
    reward_fn_kwargs: dict[str, Any] = field(default_factory=dict)
    reward_fn_placement: str = REWARD_FN_PLACEMENT
    processes: int | None = SCORER_PROCESSES
    spare_after: float = SCORER_SPARE_AFTER
    max_spares: int = SCORER_SPARES
    spare_idle: float = SCORER_SPARE_IDLE
    output_cap: int = SCORER_OUTPUT_CAP
    max_lost_threads: int = MAX_LOST_THREADS
    start_method: str | None = None
    reply_bytes: int = SCORER_REPLY_BYTES

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


def reply_bytes_for(max_result_bytes: int) -> int:
    """The bytes a scorer process may send back for a worker storing ``max_result_bytes`` per key:
    :data:`~rewardq.reward.execution.settings.SCORER_REPLY_FACTOR` times it (a pickled result can take several times
    its stored JSON: a numpy float pickles to ~100 bytes), at least 8 MiB. The worker's own check
    against ``max_result_bytes`` decides afterwards."""
    return max(8 * 1024 * 1024, SCORER_REPLY_FACTOR * int(max_result_bytes))
