"""Reading verl's reward-loop batches back into exact outputs (rewardq.integrations.verl.batch, no verl)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from rewardq.integrations.verl.batch import dataset_row, trajectory_outputs


def right_padded(rows: list[list[int]]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence([torch.tensor(r) for r in rows], batch_first=True, padding_value=0)


def agent_loop_batch(prompts: list[list[int]], responses: list[list[int]], **columns: Any) -> SimpleNamespace:
    """What verl's AgentLoopWorker._compute_score builds: every row right-padded, lengths beside."""
    n = len(prompts)
    full = [p + r for p, r in zip(prompts, responses)]
    batch = {
        "prompts": right_padded(prompts),
        "responses": right_padded(responses),
        "attention_mask": right_padded([[1] * len(f) for f in full]),
    }
    non_tensor = {
        **{k: np.array([v] * n, dtype=object) for k, v in columns.items()},
        "__num_turns__": np.array([2] * n),
        "tool_extra_fields": np.array([{"turn": i} for i in range(n)], dtype=object),
        "prompt_len": np.array([len(p) for p in prompts]),
        "response_len": np.array([len(r) for r in responses]),
    }
    return SimpleNamespace(batch=batch, non_tensor_batch=non_tensor)


def test_every_output_gets_its_exact_ids_even_a_short_final_one() -> None:
    prompts = [[11] * 50, [12] * 30]
    responses = [[21] * 30, [22, 23, 24, 25]]  # the final output is shorter than the first
    data = agent_loop_batch(prompts, responses, data_source="openai/gsm8k", uid="u1", multi_modal_data={})
    outputs = trajectory_outputs(data)
    assert [o["prompt_ids"].tolist() for o in outputs] == prompts
    assert [o["response_ids"].tolist() for o in outputs] == responses
    assert [o["num_turns"] for o in outputs] == [2, 2]
    assert [o["extra_fields"] for o in outputs] == [{"turn": 0}, {"turn": 1}]
    # verl's own arithmetic on the same batch cuts the final response to nothing
    mask, width = data.batch["attention_mask"][-1], data.batch["responses"].shape[-1]
    assert int(mask[-width:].sum()) == 0
    sample = dataset_row(data, frozenset({"multi_modal_data"}))
    assert sample == {"data_source": "openai/gsm8k", "uid": "u1"}


def test_the_trainers_layout_reads_the_mask() -> None:
    prompts = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])  # left-padded
    responses = torch.tensor([[1, 2, 0], [3, 0, 0]])  # right-padded
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]])
    data = SimpleNamespace(
        batch={"prompts": prompts, "responses": responses, "attention_mask": mask, "response_mask": mask[:, 4:]},
        non_tensor_batch={"data_source": np.array(["a", "b"], dtype=object)},
    )
    out = trajectory_outputs(data)
    assert [o["prompt_ids"].tolist() for o in out] == [[5, 6], [7, 8, 9, 10]]
    assert [o["response_ids"].tolist() for o in out] == [[1, 2], [3]]
    assert [o["response_mask"].tolist() for o in out] == [[1, 1], [1]]
    assert dataset_row(data) == {"data_source": "b"}
