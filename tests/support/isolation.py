"""Helpers for the scorer-isolation tests: the test scorer files, a one-output trajectory batch,
is a process alive."""

from __future__ import annotations

import os
from pathlib import Path

from tensordict import TensorDict

from tests.support.records import TOK, trajectory_batch

__all__ = ["MISBEHAVING", "REMOTE_SCORERS", "TOK", "alive", "trajectory"]

#: The scorer files, as a ``--reward-fn`` / ``scorer_spec`` path names them.
MISBEHAVING = str(Path(__file__).with_name("misbehaving.py"))
REMOTE_SCORERS = str(Path(__file__).with_name("remote_scorers.py"))


def trajectory(response: str, ground_truth: str = "ok", data_source: str = "test") -> TensorDict:
    sample = {"data_source": data_source, "reward_model": {"ground_truth": ground_truth}, "extra_info": {}}
    return trajectory_batch(response, sample=sample)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
