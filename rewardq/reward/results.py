"""What a manager and a scoring function return, checked and normalised as verl does.

The worker checks every ``run_single`` result with :func:`check_manager_output`; managers turn a
scoring function's value into a result with :func:`normalize_result`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError, ScoringError

if TYPE_CHECKING:
    from rewardq.reward.base import RewardManager

#: The values of :attr:`~rewardq.reward.base.RewardManager.reads`.
READS = ("trajectory", "final")


def reads_of(manager: RewardManager) -> str:
    """What ``manager.run_single`` reads: the ``reads`` of the most derived class that declares it
    or defines ``run_single``; one that defines ``run_single`` without declaring ``reads`` reads
    the whole trajectory. Raises ConfigError for a value not in :data:`READS`."""
    for cls in type(manager).__mro__:
        if "reads" in cls.__dict__:
            declared = cls.__dict__["reads"]
            if declared not in READS:
                raise ConfigError(f"{cls.__name__}.reads must be one of {', '.join(READS)}, got {declared!r}")
            return str(declared)
        if "run_single" in cls.__dict__:
            return "trajectory"
    return "trajectory"


def normalize_result(result: object) -> dict[str, object]:
    """verl's normalisation of a scoring function's return value.

    A dict gives ``reward_score = result["score"]`` and ``reward_extra_info = the whole dict``;
    a scalar gives ``reward_score = float(result)`` and ``reward_extra_info = {"acc": result}``.
    Raises ScoringError for a dict without ``score``, a non-numeric value, NaN or infinity.
    """
    if isinstance(result, dict):
        if "score" not in result:
            raise ScoringError(
                f"the scoring function returned a dict without 'score' (keys: {sorted(result)}); "
                "return a number or a dict with a 'score' entry"
            )
        score = to_float(result["score"], "score")
        return {"reward_score": score, "reward_extra_info": dict(result)}
    score = to_float(result, "the return value")
    acc = result.item() if hasattr(result, "item") else result
    return {"reward_score": score, "reward_extra_info": {"acc": acc}}


def to_float(value: object, what: str = "reward_score") -> float:
    """A finite plain float, or ScoringError explaining what came back instead."""
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            raise ScoringError(f"{what} is an array, not a single number") from None
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, (int, float)):
        raise ScoringError(f"{what} must be a number, got {type(value).__name__} {value!r:.80}")
    try:
        number = float(value)
    except OverflowError:  # an int past float's range (about 1.8e308)
        raise ScoringError(
            f"{what} is an integer of {int_size(int(value))}, larger than any float (about 1.8e308); "
            "a reward must be a finite number"
        ) from None
    if not math.isfinite(number):
        raise ScoringError(f"{what} is {number}; a reward must be a finite number")
    return number


def int_size(value: int) -> str:
    """How long ``value`` is, for an error (``about 401 digits``), without writing it out (Python
    refuses to write an int of over 4,300 digits)."""
    return f"about {max(1, round(value.bit_length() * math.log10(2))):,} digits"


def check_manager_output(out: object, n: int) -> list[dict[str, Any]]:
    """Validate what ``run_single`` returned and expand it to one result per output.

    Returns n dicts ``{"reward_score": float, "reward_extra_info": dict}``.
    """
    if isinstance(out, dict):
        items, per_output = [out], False
    elif isinstance(out, (list, tuple)):
        if len(out) != n:
            raise ScoringError(
                f"the manager returned {len(out)} results for a trajectory of {n} outputs; "
                "return one dict, or one per output"
            )
        items, per_output = list(out), True
    else:
        raise ScoringError(f"run_single must return a dict or a list of dicts, got {type(out).__name__}")
    checked = []
    for item in items:
        if not isinstance(item, dict) or "reward_score" not in item:
            raise ScoringError(
                "each result must be a dict with 'reward_score' (and optionally "
                f"'reward_extra_info'), got {item!r:.120}"
            )
        extra = item.get("reward_extra_info") or {}
        if not isinstance(extra, dict):
            raise ScoringError(f"reward_extra_info must be a dict, got {type(extra).__name__}")
        checked.append({"reward_score": to_float(item["reward_score"]), "reward_extra_info": extra})
    return checked if per_output else checked * n


def reject_unknown_options(manager: str, options: dict[str, object], known: list[str]) -> None:
    """Fail fast on a misspelt manager option."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"manager {manager!r} does not take option(s) {unknown}; it takes {sorted(known)}")
