"""Synthetic simultaneous-translation trajectories for the SeqPO-SiMT example.

A "language pair" is a fixed word-to-word mapping (source word ``w`` translates to a
deterministic pseudo-word), so references are exact and the expected reward of every
generated trajectory can be computed independently of rewardq. Each trajectory follows a
noisy wait-k policy: the source arrives in chunks of 1–3 words; after each chunk the
policy writes the translation of every source word at least ``k`` words behind what it has
read (on the last step, everything); with probability ``error_rate`` a word is
mistranslated. Every step is one output: ``response_ids`` = the chunk written at that
step (possibly empty: the policy waited), ``extra_fields.source_read`` = source words read.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from tests.support.seqpo_simt.manager import fused_reward

if TYPE_CHECKING:
    from rewardq.reward.tokenizer import Tokenizer

_WORDS = (
    "the model reads a stream of source words and writes its translation while listening to the "
    "speaker who talks about weather markets science music football history cities rivers trains "
    "coffee bread gardens stars engines bridges voices numbers letters windows mountains"
).split()


def translate_word(word: str) -> str:
    """The pseudo-target word of a source word (a fixed, invertible mapping)."""
    return word[::-1] + "o"


def make_simt_trajectories(
    n: int, seed: int, tokenizer: Tokenizer, *, latency_weight: float = 0.5, error_rate: float = 0.15
) -> list[dict[str, Any]]:
    """``n`` trajectories ``{"uid", "session_id", "sample", "outputs", "expected"}``.

    ``expected`` is the reward SeqPO-SiMT gives (``latency_weight`` λ), computed from the
    generated text directly.
    """
    rng = random.Random(seed)
    out = []
    for t in range(n):
        src = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        ref = [translate_word(w) for w in src]
        k = rng.randint(1, 4)
        read, written = 0, 0
        outputs: list[dict[str, Any]] = []
        chunks: list[str] = []
        reads: list[int] = []
        prompt = "Translate simultaneously:"
        while read < len(src):
            read = min(len(src), read + rng.randint(1, 3))
            upto = len(src) if read == len(src) else max(written, read - k)
            words = []
            for i in range(written, upto):
                words.append(rng.choice(_WORDS) if rng.random() < error_rate else ref[i])
            written = upto
            chunk = " ".join(words)
            chunks.append(chunk)
            reads.append(read)
            prompt_text = f"{prompt} {' '.join(src[:read])} ||| {' '.join(c for c in chunks[:-1] if c)}"
            outputs.append(
                {
                    "prompt_ids": tokenizer.encode(prompt_text),
                    "response_ids": tokenizer.encode(chunk),
                    "num_turns": 2 * len(outputs) + 2,
                    "extra_fields": {"source_read": read},
                }
            )
        expected = fused_reward(chunks, reads, " ".join(ref), len(src), latency_weight=latency_weight)
        out.append(
            {
                "uid": f"simt-{seed}-{t}",
                "session_id": "0",
                "outputs": outputs,
                "sample": {
                    "data_source": "simt/synthetic",
                    "reward_model": {"ground_truth": " ".join(ref)},
                    "extra_info": {"source": " ".join(src), "wait_k": k},
                },
                "expected": expected,
                "chunks": chunks,
                "reads": reads,
            }
        )
    return out
