"""Scoring functions the remote-manager tests load in scorer processes (by file path)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from rewardq.reward.warm_up import warms_up_with


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, bonus: float = 0.0
) -> dict[str, Any]:
    """1.0 + bonus when the response equals the ground truth, else 0.0; reports its process and extras."""
    return {
        "score": (1.0 if solution_str.strip() == str(ground_truth) else 0.0) + bonus,
        "pid": os.getpid(),
        "seen_extra": dict(extra_info or {}),
    }


def by_behaviour(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> float:
    """What the response asks for: ``hang``, ``segfault``, ``exit``, ``raise``, ``sleep:<s>``, else score 1."""
    if solution_str == "hang":
        while True:
            time.sleep(1)
    if solution_str == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if solution_str == "exit":
        os._exit(3)
    if solution_str == "raise":
        raise ValueError("scorer refused this answer")
    if solution_str.startswith("sleep:"):
        time.sleep(float(solution_str.split(":")[1]))
    return 1.0


async def async_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> float:
    return 1.0


def _slow_import() -> None:
    """Stands for a large library's import: 3 s, once per process (its pid marked in the environment)."""
    time.sleep(3.0)
    os.environ["REMOTE_SCORERS_WARMED"] = str(os.getpid())


@warms_up_with(_slow_import)
def slow_to_warm(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """1.0 when the response equals the ground truth; says whether its process warmed up first."""
    warmed = os.environ.get("REMOTE_SCORERS_WARMED") == str(os.getpid())
    return {"score": 1.0 if solution_str.strip() == str(ground_truth) else 0.0, "warmed": warmed}


def _hang_once() -> None:
    """A warm-up that hangs, once: when the file ``$REMOTE_SCORERS_HANG_FLAG`` names exists, it is
    removed and this process's warm-up never ends."""
    flag = os.environ.get("REMOTE_SCORERS_HANG_FLAG")
    if flag and os.path.exists(flag):
        os.remove(flag)
        while True:
            time.sleep(1)


@warms_up_with(_hang_once)
def hangs_to_warm(
    data_source: str = "", solution_str: str = "", ground_truth: Any = None, extra_info: dict[str, Any] | None = None
) -> float:
    """:func:`by_behaviour`, with a warm-up that hangs once on request (:func:`_hang_once`)."""
    return by_behaviour(data_source, solution_str, ground_truth, extra_info)
