"""A reward function and managers whose *results* are hostile on request, for the result-limit tests.

The final output's decoded response says what to return:

``blob:<MiB>``    ``{"score": 0.25, "blob": "x" * MiB}``: a huge extra info
``near:<KiB>``    ``{"score": 0.5, "pad": "y" * KiB}``: large but within ``max_result_bytes``
``cycle``         an extra info that contains itself
``deep``          an extra info nested 3,000 levels deep
``keys``          an extra info with the keys ``1`` and ``"1"``
``surrogate``     an extra info whose text holds a lone surrogate
``cancel``        (managers only) raise ``asyncio.CancelledError`` from ``run_single``
``base``          (managers only) raise a ``BaseException`` that is no ``Exception``
anything else     ``{"score": <ground truth as a number>, "echo": <the response>}``

Loaded as ``--reward-fn tests/support/hostile_results.py:hostile_result`` (a sync function in
scorer processes, behind the ``naive`` manager), or ``--manager tests.support.hostile_results:
HostileResultManager`` (in the worker's own process; ``per_output=true`` gives each key its own
result, the last carrying the hostile value).
"""

from __future__ import annotations

import asyncio
from typing import Any

from rewardq.reward.base import RewardManager

MiB = 1024 * 1024


class Odd(BaseException):
    """A BaseException a careless manager may raise (neither Exception nor a shutdown)."""


def hostile_value(text: str, ground_truth: Any) -> dict[str, Any]:
    verb, _, arg = text.partition(":")
    if verb == "blob":
        return {"score": 0.25, "blob": "x" * (int(arg) * MiB)}
    if verb == "near":
        return {"score": 0.5, "pad": "y" * (int(arg) * 1024)}
    if verb == "cycle":
        d: dict[str, Any] = {"score": 0.1}
        d["self"] = d
        return d
    if verb == "deep":
        root: dict[str, Any] = {"score": 0.1}
        node = root
        for _ in range(3000):
            node["a"] = {}
            node = node["a"]
        return root
    if verb == "keys":
        keys: dict[Any, Any] = {"score": 0.1, 1: "int", "1": "str"}  # a key that is not a string
        return keys
    if verb == "surrogate":
        return {"score": 0.3, "pred": "bad\udc80text"}
    return {"score": float(ground_truth), "echo": text}


def hostile_result(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    """A sync reward function (see the module doc)."""
    return hostile_value(solution_str, ground_truth)


class HostileResultManager(RewardManager):
    """A custom manager whose result is hostile on request (see the module doc)."""

    name = "test-hostile-result"

    def __init__(
        self, tokenizer: Any = None, compute_score: Any = None, *, context: Any = None, per_output: bool = False
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        self.per_output = bool(per_output)

    async def run_single(self, data: Any) -> Any:
        from rewardq.reward.final_output import read_final_output  # torch: not in scorer processes

        final = read_final_output(self, data)
        text = final.solution_str
        if text == "cancel":
            raise asyncio.CancelledError()
        if text == "base":
            raise Odd("an odd BaseException")
        value = hostile_value(text, final.ground_truth)
        score = float(value.pop("score"))
        if not self.per_output:
            return {"reward_score": score, "reward_extra_info": value}
        n = int(data.batch_size[0])
        return [{"reward_score": score, "reward_extra_info": {"i": i}} for i in range(n - 1)] + [
            {"reward_score": score, "reward_extra_info": value}
        ]
