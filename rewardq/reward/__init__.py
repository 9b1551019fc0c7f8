"""Scoring a trajectory: the manager contract, the registry, the built-in managers and scorers.

Everything a reward-manager author needs imports from here::

    from rewardq.reward import RewardManager, last_row, non_tensor, register, valid_response_ids

* :mod:`.base`        the contract (:class:`RewardManager`); :mod:`.context` what the worker hands it;
* :mod:`.registry`    names to manager classes (``--manager``); :mod:`.factory` builds one from the config;
* :mod:`.rows`, :mod:`.final_output`, :mod:`.results`   reading the batch, checking what comes back;
* :mod:`.managers`    the built-in managers; :mod:`.scoring` the default scorers by ``data_source``;
* :mod:`.judge`, :mod:`.codeexec`, :mod:`.ratelimit`   LLM judges, code execution, fleet-wide rate limits
  (a feature folder each: its policy, its Lua and the calls that send its Redis commands, through
  the client it is given; only :mod:`rewardq.queue` imports redis-py);
* :mod:`.execution`   where scoring functions run (threads, scorer processes), which the worker starts.

The row readers need torch and tensordict (a worker's install, ``rewardq[worker]``); they
are imported on first use, so ``import rewardq.reward`` alone stays light (scorer child
processes import it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewardq._lazy import lazy_getattr
from rewardq.reward.base import ManagerContext, RewardManager
from rewardq.reward.registry import get_manager_class, known_managers, register
from rewardq.reward.results import normalize_result

if TYPE_CHECKING:
    from rewardq.reward.final_output import (
        FinalOutput,
        merge_rollout_fields,
        read_final_output,
        score_final_output,
    )
    from rewardq.reward.rows import (
        copy_value,
        last_row,
        non_tensor,
        valid_prompt_ids,
        valid_response_ids,
    )

_LAZY = {
    "copy_value": "rewardq.reward.rows",
    "last_row": "rewardq.reward.rows",
    "non_tensor": "rewardq.reward.rows",
    "valid_prompt_ids": "rewardq.reward.rows",
    "valid_response_ids": "rewardq.reward.rows",
    "FinalOutput": "rewardq.reward.final_output",
    "merge_rollout_fields": "rewardq.reward.final_output",
    "read_final_output": "rewardq.reward.final_output",
    "score_final_output": "rewardq.reward.final_output",
}

__all__ = [
    "FinalOutput",
    "ManagerContext",
    "RewardManager",
    "copy_value",
    "get_manager_class",
    "known_managers",
    "last_row",
    "merge_rollout_fields",
    "non_tensor",
    "normalize_result",
    "read_final_output",
    "register",
    "score_final_output",
    "valid_prompt_ids",
    "valid_response_ids",
]


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return __all__
