"""Helpers for the scorer-isolation tests: a one-output trajectory batch and a naive manager factory."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rewardq.consumers.batch import build_batch
from rewardq.queue.codec import OutputRecord
from rewardq.reward.tokenizer import load_tokenizer

TOK = load_tokenizer("builtin:demo")
MISBEHAVING = str(Path(__file__).with_name("misbehaving.py"))


def trajectory(response: str, ground_truth: str = "ok", data_source: str = "test") -> object:
    sample = {"data_source": data_source, "reward_model": {"ground_truth": ground_truth}, "extra_info": {}}
    record = OutputRecord(
        uid="u",
        session_id="s",
        index=0,
        final=True,
        prompt_ids=np.array(TOK.encode("Q?"), dtype=np.int32),
        response_ids=np.array(TOK.encode(response), dtype=np.int32),
        sample=sample,
    )
    return build_batch([record])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
