"""Outputs, records and one-trajectory batches encoded with the demo tokenizer.

:func:`text_output` is what a producer hands to ``put_trajectory``; :func:`record` and
:func:`trajectory_batch` are what a manager receives (their uid and session id are fixed,
``u`` / ``s``: a batch never carries them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tensordict import TensorDict

from rewardq.consumers.batch import build_batch
from rewardq.queue.codec import OutputRecord
from rewardq.reward.tokenizer import load_tokenizer
from rewardq.reward.tokenizer_backends import FastTokenizer

_demo = load_tokenizer("builtin:demo")
assert isinstance(_demo, FastTokenizer)  # the demo tokenizer: tests use its eos_token_id and backend too
TOK: FastTokenizer = _demo


def text_output(response: str, prompt: str = "Q?") -> dict[str, Any]:
    """An output as ``put_output`` / ``put_trajectory`` take it, its prompt and response encoded."""
    return {
        "prompt_ids": np.asarray(TOK.encode(prompt), dtype=np.int32),
        "response_ids": np.asarray(TOK.encode(response), dtype=np.int32),
    }


def record(
    index: int,
    response: str | list[int],
    *,
    sample: dict[str, Any],
    final: bool = False,
    prompt: str = "Q?",
    eos: bool = False,
    num_turns: int | None = None,
    extra_fields: dict[str, Any] | None = None,
    reward_score: float | None = None,
    response_mask: list[int] | None = None,
) -> OutputRecord:
    """Output ``index`` whose response is ``response`` (text, encoded, or ids), plus EOS with ``eos``."""
    ids = TOK.encode(response) if isinstance(response, str) else list(response)
    if eos:
        eos_id = TOK.eos_token_id
        assert eos_id is not None
        ids = ids + [eos_id]
    return OutputRecord(
        uid="u",
        session_id="s",
        index=index,
        final=final,
        prompt_ids=np.asarray(TOK.encode(prompt), dtype=np.int32),
        response_ids=np.asarray(ids, dtype=np.int32),
        response_mask=None if response_mask is None else np.asarray(response_mask, dtype=np.uint8),
        num_turns=num_turns,
        extra_fields=extra_fields or {},
        reward_score=reward_score,
        sample=sample,
    )


def trajectory_batch(*responses: str, **kw: Any) -> TensorDict:
    """The batch of one trajectory with these responses, in order (the last one final);
    ``kw`` goes to every :func:`record`."""
    n = len(responses)
    return build_batch([record(i, r, final=i == n - 1, **kw) for i, r in enumerate(responses)])


#: A sample graded by an LLM judge: the question in ``raw_prompt``, the reference answer 42.
JUDGED_SAMPLE: dict[str, Any] = {
    "data_source": "judged",
    "reward_model": {"ground_truth": "42"},
    "raw_prompt": [{"role": "user", "content": "What is 6*7?"}],
}


def judged_batch(*responses: str, sample: dict[str, Any] = JUDGED_SAMPLE) -> TensorDict:
    """The batch of one judged trajectory (:data:`JUDGED_SAMPLE`) with these responses."""
    return trajectory_batch(*responses, sample=sample, prompt="What is 6*7?")
