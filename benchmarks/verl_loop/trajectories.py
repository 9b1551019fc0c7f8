"""Realistic multi-turn trajectories with real tokenizer ids, as verl's agent loop hands them over.

Trajectory ``i`` of a scorer depends only on ``(seed, scorer, i)``, so the orchestrator (which
computes the reference rewards) and each side process (which submits them) build the same one.
Shape, as in :mod:`benchmarks.workload`: 1-8 outputs; each a ~500-id prompt (normal, sd 50,
300..700) and a 1,000-4,000-id response (uniform) whose ``response_mask`` zeroes tool-observation
spans on the outputs after the first. Ids are drawn from the real tokenizer's plain (non-special)
vocabulary; the final response ends with the tokens of the scorer's answer text:

* ``gsm8k``: ``... The answer is\\n#### <n>`` (data source ``openai/gsm8k``), right half the time;
* ``math_verify``: ``... so the answer is $\\boxed{0.25}$`` against the ground truth
  ``\\frac{1}{4}`` (equivalent, not equal, strings: what math-verify is for), right half the time;
* ``code``: a fenced Python program reading stdin (data source ``codecontests``, three test
  cases), right 80 % of the time, else passing 2 of 3.

:meth:`Trajectory.verl_outputs` builds verl's own ``AgentLoopOutput`` objects (ids as Python
lists, as verl's agent loop has them); :meth:`Trajectory.kwargs` the dataset row verl passes with
them. Lists share the int objects of one pooled list, so 2,048 trajectories hold ~250 MB.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from benchmarks.verl_loop.tokenizer import fast_tokenizer, plain_ids

SCORERS = ("gsm8k", "math_verify", "code")
POOL = 1 << 20
MAX_OUTPUTS = 8
DATA_SOURCES = {"gsm8k": "openai/gsm8k", "math_verify": "bench/math-verify", "code": "codecontests"}
PROGRAM = "n = int(input())\nprint(n * n)\n"
PARTIAL = "n = int(input())\nprint(n * n if n < 3 else 0)\n"
SQUARES = json.dumps({"inputs": ["1\n", "2\n", "3\n"], "outputs": ["1\n", "4\n", "9\n"]})


@lru_cache(maxsize=2)
def _pools(seed: int) -> tuple[list[int], list[int]]:
    """The id pool and the mask pool, as Python lists (their int objects are shared by every slice)."""
    rng = np.random.default_rng([seed, 0x7E11])
    plain = plain_ids()
    ids = plain[rng.integers(0, plain.shape[0], POOL)]
    mask = np.ones(POOL, dtype=np.int64)
    for at in range(0, POOL, 1000):
        start = at + int(rng.integers(0, 800))
        mask[start : start + int(rng.integers(50, 200))] = 0
    return ids.tolist(), mask.tolist()


@lru_cache(maxsize=8192)
def _encode(text: str) -> tuple[int, ...]:
    return tuple(fast_tokenizer().encode(text, add_special_tokens=False).ids)


@lru_cache(maxsize=1)
def eos_id() -> int:
    tok = fast_tokenizer()
    eos = tok.token_to_id("<｜end▁of▁sentence｜>")
    return int(eos) if eos is not None else 1


def answer_text(scorer: str, rng: np.random.Generator) -> tuple[str, Any, bool]:
    """``(tail text, ground truth, right)`` of one trajectory's final response."""
    if scorer == "gsm8k":
        answer, right = int(rng.integers(1, 1000)), bool(rng.random() < 0.5)
        said = answer if right else answer + int(rng.integers(1, 50))
        return f" So the total is {said}.\nThe answer is\n#### {said}", str(answer), right
    if scorer == "math_verify":
        num, den, right = int(rng.integers(1, 10)), int(rng.choice([2, 4, 5, 8])), bool(rng.random() < 0.5)
        value = num / den if right else (num + 1) / den
        return f" Putting it together, so the answer is $\\boxed{{{value:g}}}$.", f"\\frac{{{num}}}{{{den}}}", right
    if scorer == "code":
        right = bool(rng.random() < 0.8)
        return f" Here is my solution.\n```python\n{PROGRAM if right else PARTIAL}```\n", SQUARES, right
    raise ValueError(f"unknown scorer {scorer!r}; choose from {', '.join(SCORERS)}")


@dataclass
class Trajectory:
    """One trajectory: spans into the pools, the final tail, the dataset row."""

    scorer: str
    index: int
    seed: int
    prompts: list[tuple[int, int]]  # (start, length) in the id pool
    responses: list[tuple[int, int]]  # (start, length of the pooled part)
    masks: list[int]  # start in the mask pool (outputs after the first)
    tail: tuple[int, ...]
    ground_truth: Any
    right: bool

    @property
    def n(self) -> int:
        return len(self.responses)

    @property
    def uid(self) -> str:
        return f"{self.scorer}-{self.seed}-{self.index}"

    def response_ids(self, k: int) -> list[int]:
        ids, _ = _pools(self.seed)
        start, length = self.responses[k]
        part = ids[start : start + length]
        return part + list(self.tail) if k == self.n - 1 else part

    def prompt_ids(self, k: int) -> list[int]:
        ids, _ = _pools(self.seed)
        start, length = self.prompts[k]
        return ids[start : start + length]

    def response_mask(self, k: int, length: int) -> list[int]:
        if k == 0:
            return [1] * length
        _, mask = _pools(self.seed)
        return mask[self.masks[k] : self.masks[k] + length]

    def final_response(self) -> list[int]:
        return self.response_ids(self.n - 1)

    def verl_valid_length(self) -> int:
        """The final response length verl's naive manager computes on verl's multi-output batch.

        ``AgentLoopWorker._compute_score`` right-pads ``prompt+response`` per row to the widest
        ``W`` and responses to the widest ``R``; the manager takes ``attention_mask[-R:].sum()``
        of the final row, i.e. ``max(0, p + r - (W - R))``, wrong whenever that row is not the
        widest. (Too long only adds pad id 0, a special token the decode skips; too short cuts
        the answer off.)
        """
        plens = [p[1] for p in self.prompts]
        rlens = [r[1] for r in self.responses]
        rlens[-1] += len(self.tail)
        width, widest = max(p + r for p, r in zip(plens, rlens)), max(rlens)
        return max(0, plens[-1] + rlens[-1] - (width - widest))

    def kwargs(self) -> dict[str, Any]:
        """The dataset row verl's agent loop passes to ``_compute_score`` (numpy values included)."""
        return {
            "data_source": DATA_SOURCES[self.scorer],
            "reward_model": {"style": "rule", "ground_truth": self.ground_truth},
            "extra_info": {"split": "train", "index": self.index},
            "raw_prompt": np.array([{"role": "user", "content": f"Problem {self.index}"}], dtype=object),
            "uid": self.uid,
            "index": np.int64(self.index),
            "agent_name": "tool_agent",
        }

    def output_fields(self, k: int) -> dict[str, Any]:
        """Output ``k``'s attributes as verl's ``AgentLoopOutput`` takes them (but ``metrics``)."""
        response = self.response_ids(k)
        return {
            "prompt_ids": self.prompt_ids(k),
            "response_ids": response,
            "response_mask": self.response_mask(k, len(response)),
            "num_turns": 2 * k + 2,
            "extra_fields": {"turn": k},
        }

    def verl_outputs(self) -> list[Any]:
        """verl's ``AgentLoopOutput`` objects, fresh (``_compute_score`` writes onto the final one)."""
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

        return [AgentLoopOutput(**self.output_fields(k), metrics=AgentLoopMetrics()) for k in range(self.n)]


class Trajectories:
    """``Trajectories(scorer, seed)[i]``: trajectory ``i``, the same in every process."""

    def __init__(self, scorer: str, seed: int = 0) -> None:
        if scorer not in SCORERS:
            raise ValueError(f"unknown scorer {scorer!r}; choose from {', '.join(SCORERS)}")
        self.scorer = scorer
        self.seed = seed

    def __getitem__(self, i: int) -> Trajectory:
        rng = np.random.default_rng([self.seed, SCORERS.index(self.scorer), i])
        n = int(rng.integers(1, MAX_OUTPUTS + 1))
        text, truth, right = answer_text(self.scorer, rng)
        tail = _encode(text) + (eos_id(),)
        plens = np.clip(rng.normal(500, 50, n), 300, 700).astype(int)
        rlens = rng.integers(1000, 4001, n)
        rlens[-1] = max(1, rlens[-1] - len(tail))
        return Trajectory(
            scorer=self.scorer,
            index=i,
            seed=self.seed,
            prompts=[(int(s), int(length)) for s, length in zip(rng.integers(0, POOL - 1000, n), plens)],
            responses=[(int(s), int(length)) for s, length in zip(rng.integers(0, POOL - 5000, n), rlens)],
            masks=[int(s) for s in rng.integers(0, POOL - 5000, n)],
            tail=tail,
            ground_truth=truth,
            right=right,
        )

    def range(self, start: int, count: int) -> list[Trajectory]:
        return [self[i] for i in range(start, start + count)]
