"""Mixed trajectories for the ledger's tests: GSM8K, MATH, a custom data source and some errors.

Built from the demo's rollouts (:func:`rewardq.demo.data.make_trajectories`, which know the
reward the default scorers give each): every 7th sample becomes ``custom/length`` (scored by
:mod:`tests.support.ledger_rewards`), every 25th ``custom/raise`` (an error result).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from rewardq.demo.data import make_trajectories
from tests.support.ledger_rewards import CUSTOM, FAILING

#: The reward functions' file, as ``--reward-fn`` takes it.
REWARDS = str(Path(__file__).with_name("ledger_rewards.py"))


def mixed_trajectories(n: int, seed: int = 0) -> list[dict[str, Any]]:
    out = []
    for t in make_trajectories(n, seed=seed):
        t = copy.deepcopy(t)
        index = t["sample"]["extra_info"]["index"]
        if index % 25 == 3:
            t["sample"]["data_source"] = FAILING
            t["expected"] = None
        elif index % 7 == 5:
            t["sample"]["data_source"] = CUSTOM
            t["expected"] = None  # the custom rule decides; the ledger must match Redis
        out.append(t)
    return out


def push_all(client: Any, trajectories: list[dict[str, Any]]) -> list[str]:
    """Put every trajectory; returns all their keys in order."""
    keys: list[str] = []
    for t in trajectories:
        keys += client.put_trajectory(t["uid"], t["session_id"], t["outputs"], t["sample"])
    return keys
