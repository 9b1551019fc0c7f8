"""The realistic workload every system in the benchmark receives: deterministic, lazy, numpy-made.

One trajectory is a multi-turn agent rollout of 1-8 outputs. Each output carries a prompt
of ~500 token ids (normal, sd 50, clipped to 300..700) and a response of 1,000-4,000 ids
(uniform), with a ``response_mask`` that zeroes tool-observation spans (50-200 ids, ~1 per 1,000) on
multi-turn outputs (outputs after the first). The dataset sample is a GSM8K row (``data_source="openai/gsm8k"``,
``reward_model.ground_truth``). The final output's response ends with the tokens of
``"... The answer is\\n#### <n><|im_end|>"``; half of the trajectories give the right answer,
so a correct scorer returns 1.0 for those and 0.0 for the others (:attr:`Trajectory.expected`).

Trajectory ``i`` depends only on ``(seed, i)``, so any process can rebuild any slice of
the workload, and nothing holds the whole backlog in memory (100,000 trajectories are
~6 GB of token ids). Token ids are int32 views into one shared pool of random ids drawn
from the bundled demo tokenizer's vocabulary (special tokens excluded).

How the payload travels is each system's business; helpers here give the two forms used:
:meth:`Trajectory.outputs` (dicts of numpy arrays, what ``RewardClient.put_trajectory``
takes) and :meth:`Trajectory.job_payload` (token ids as raw little-endian bytes, what the
peer frameworks' native serializers carry).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

#: Number of random ids in the shared pool; responses are slices of it at random offsets.
POOL_SIZE = 1 << 22
#: Trajectories whose random parameters are drawn together.
BLOCK = 1024
MAX_OUTPUTS = 8
_ONES = np.ones(4000, dtype=np.uint8)
DATA_SOURCE = "openai/gsm8k"


@lru_cache(maxsize=1)
def tokenizer() -> Any:
    """The bundled demo tokenizer (``load_tokenizer("builtin:demo")``), loaded once per process."""
    from rewardq.reward.tokenizer import load_tokenizer

    return load_tokenizer("builtin:demo")


@lru_cache(maxsize=4)
def _pool(seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0xB00C])
    first_plain = 3  # ids 0..2 are the special tokens of the demo tokenizer
    return rng.integers(first_plain, tokenizer().vocab_size, POOL_SIZE, dtype=np.int32)


@lru_cache(maxsize=4)
def _mask_pool(seed: int) -> np.ndarray:
    """Ones with a tool-observation span (zeros, 50-200 long) every ~1,000 positions."""
    rng = np.random.default_rng([seed, 0x3A5C])
    mask = np.ones(POOL_SIZE, dtype=np.uint8)
    for at in range(0, POOL_SIZE, 1000):
        start = at + int(rng.integers(0, 800))
        mask[start : start + int(rng.integers(50, 200))] = 0
    return mask


@lru_cache(maxsize=4096)
def _tail(answer: str) -> np.ndarray:
    tok = tokenizer()
    ids = tok.encode(f" So the total is {answer}.\nThe answer is\n#### {answer}")
    eos = tok.eos_token_id
    return np.asarray(ids + ([eos] if eos is not None else []), dtype=np.int32)


#: ``--scorer``: ``gsm8k`` (decode the final response, strict regex: the realistic workload)
#: or ``trivial`` (no decode: the issue's reference measurement of queue overhead).
SCORERS = ("gsm8k", "trivial")


def trivial_score(n_response_ids: int) -> float:
    """The trivial scorer: 1.0 when the final response has an even number of ids, else 0.0.

    O(1) and decode-free, so a run with it measures what each system costs around the
    scoring; it still depends on the record, so a wrong or misrouted result is caught.
    """
    return 1.0 if n_response_ids % 2 == 0 else 0.0


@dataclass
class Trajectory:
    """One multi-turn trajectory: its outputs' token ids and its GSM8K sample."""

    index: int
    uid: str
    session_id: str
    prompts: list[np.ndarray]
    responses: list[np.ndarray]
    masks: list[np.ndarray]
    ground_truth: str
    correct: bool

    @property
    def tid(self) -> str:
        return f"{self.uid}_{self.session_id}"

    @property
    def n(self) -> int:
        return len(self.responses)

    @property
    def keys(self) -> list[str]:
        """The output keys ``<uid>_<session_id>_<i>`` every system writes a reward for."""
        return [f"{self.tid}_{i}" for i in range(self.n)]

    @property
    def expected(self) -> float:
        """The GSM8K strict score a correct scorer gives (the same for every key)."""
        return 1.0 if self.correct else 0.0

    def expected_for(self, scorer: str) -> float:
        """The reward every key should get under ``scorer`` (one of :data:`SCORERS`)."""
        return trivial_score(int(self.responses[-1].shape[0])) if scorer == "trivial" else self.expected

    @property
    def tokens(self) -> int:
        return int(sum(p.shape[0] for p in self.prompts) + sum(r.shape[0] for r in self.responses))

    def sample(self) -> dict[str, Any]:
        """The dataset row (verl's GSM8K columns)."""
        return {
            "data_source": DATA_SOURCE,
            "reward_model": {"style": "rule", "ground_truth": self.ground_truth},
            "extra_info": {"split": "train", "index": self.index},
        }

    def outputs(self) -> list[dict[str, Any]]:
        """Outputs as ``RewardClient.put_trajectory`` takes them (numpy arrays, no copies)."""
        return [
            {"prompt_ids": p, "response_ids": r, "response_mask": m, "num_turns": i + 1}
            for i, (p, r, m) in enumerate(zip(self.prompts, self.responses, self.masks))
        ]

    def job_payload(self) -> dict[str, Any]:
        """One peer job: token ids as int32 / uint8 little-endian bytes, plus the sample."""
        return {
            "tid": self.tid,
            "n": self.n,
            "sample": self.sample(),
            "outputs": [
                {
                    "index": i,
                    "num_turns": i + 1,
                    "prompt_ids": p.tobytes(),
                    "response_ids": r.tobytes(),
                    "response_mask": m.tobytes(),
                }
                for i, (p, r, m) in enumerate(zip(self.prompts, self.responses, self.masks))
            ],
        }


class Workload:
    """The deterministic workload: ``Workload(seed)[i]`` is trajectory ``i``.

    Random parameters are drawn per block of :data:`BLOCK` trajectories (vectorised, seeded
    by ``(seed, block)``), so building a trajectory is a handful of slices: ~20 µs.

    Args:
        seed: selects the whole workload; two processes with the same seed agree.
        tag: prefix of every uid, so concurrent runs (and phases) never share a key.
    """

    def __init__(self, seed: int = 0, tag: str = "b") -> None:
        self.seed = seed
        self.tag = tag
        self._block: tuple[int, dict[str, np.ndarray]] | None = None

    def _params(self, b: int) -> dict[str, np.ndarray]:
        if self._block is not None and self._block[0] == b:
            return self._block[1]
        rng = np.random.default_rng([self.seed, b, 0x7EA])
        k = BLOCK * MAX_OUTPUTS
        params = {
            "n": rng.integers(1, MAX_OUTPUTS + 1, BLOCK),
            "plen": np.clip(rng.normal(500, 50, k), 300, 700).astype(np.int64).reshape(BLOCK, MAX_OUTPUTS),
            "rlen": rng.integers(1000, 4001, k).reshape(BLOCK, MAX_OUTPUTS),
            "pstart": rng.integers(0, POOL_SIZE - 1000, k).reshape(BLOCK, MAX_OUTPUTS),
            "rstart": rng.integers(0, POOL_SIZE - 5000, k).reshape(BLOCK, MAX_OUTPUTS),
            "mstart": rng.integers(0, POOL_SIZE - 5000, k).reshape(BLOCK, MAX_OUTPUTS),
            "answer": rng.integers(1, 1000, BLOCK),
            "correct": rng.random(BLOCK) < 0.5,
            "miss": rng.integers(1, 50, BLOCK),
        }
        self._block = (b, params)
        return params

    def __getitem__(self, i: int) -> Trajectory:
        b, j = divmod(i, BLOCK)
        p = self._params(b)
        pool, masks_pool = _pool(self.seed), _mask_pool(self.seed)
        n, answer, correct = int(p["n"][j]), int(p["answer"][j]), bool(p["correct"][j])
        said = answer if correct else answer + int(p["miss"][j])
        prompts, responses, masks = [], [], []
        for k in range(n):
            ps, pl = int(p["pstart"][j, k]), int(p["plen"][j, k])
            rs, rl, ms = int(p["rstart"][j, k]), int(p["rlen"][j, k]), int(p["mstart"][j, k])
            prompts.append(pool[ps : ps + pl])
            if k == n - 1:
                tail = _tail(str(said))
                responses.append(np.concatenate([pool[rs : rs + rl - tail.shape[0]], tail]))
            else:
                responses.append(pool[rs : rs + rl])
            # the first turn is all model tokens; later turns carry tool observations (mask 0)
            masks.append(_ONES[:rl] if k == 0 else masks_pool[ms : ms + rl])
        return Trajectory(
            index=i,
            uid=f"{self.tag}{i}",
            session_id="s0",
            prompts=prompts,
            responses=responses,
            masks=masks,
            ground_truth=str(answer),
            correct=correct,
        )

    def range(self, start: int, count: int) -> Iterator[Trajectory]:
        """Trajectories ``start .. start+count-1``, built one at a time."""
        for i in range(start, start + count):
            yield self[i]


def score_final_response(response_ids: Any, ground_truth: str) -> float:
    """The scoring work every system does: decode the final response, GSM8K strict regex.

    Identical to rewardq's ``naive`` manager on a GSM8K sample: ``decode(ids,
    skip_special_tokens=True)`` with the demo tokenizer, then
    ``rewardq.reward.scoring.gsm8k.compute_score`` (strict ``#### <n>`` on the last 300 chars).
    """
    from rewardq.reward.scoring.gsm8k import compute_score

    if isinstance(response_ids, (bytes, bytearray, memoryview)):
        response_ids = np.frombuffer(response_ids, dtype="<i4")
    text = tokenizer().decode(response_ids, skip_special_tokens=True)
    return compute_score(text, ground_truth)
