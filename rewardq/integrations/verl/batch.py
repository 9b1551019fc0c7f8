"""A verl reward-loop batch (``DataProto``) back into the exact outputs of its trajectory; no verl import here.

verl's reward loop hands ``run_single`` one trajectory as a padded batch, in one of two layouts:

* **the agent loop's** (``AgentLoopWorker._compute_score``): one row per output, ``prompts``,
  ``responses`` and ``attention_mask`` right-padded to the longest row, and each row's true lengths
  in ``non_tensor_batch["prompt_len"]`` / ``["response_len"]``. The exact ids are
  ``prompts[i, :prompt_len[i]]`` and ``responses[i, :response_len[i]]``. verl's own managers
  instead read the final response's length from the tail of the last row's attention mask, which
  cuts it whenever that row is not the longest; that arithmetic is never used here.
* **the trainer's** (``RewardLoopManager.compute_rm_score`` on a training batch): one row per
  trajectory, prompts left-padded and responses right-padded under one attention mask over both.
  Without lengths, the mask says which prompt and response positions are real.

The dataset row's columns repeat on every row of ``non_tensor_batch``; the last row's are the
sample. ``__num_turns__`` and ``tool_extra_fields`` are each output's ``num_turns`` and
``extra_fields``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: ``non_tensor_batch`` columns verl adds per output, not dataset columns.
PER_OUTPUT_COLUMNS = frozenset({"__num_turns__", "tool_extra_fields", "prompt_len", "response_len"})


def _numpy(value: object) -> np.ndarray:
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def trajectory_outputs(data: Any) -> list[dict[str, Any]]:
    """The outputs of the trajectory in ``data`` (a verl ``DataProto``), with their exact ids."""
    batch, columns = data.batch, data.non_tensor_batch
    prompts, responses = _numpy(batch["prompts"]), _numpy(batch["responses"])
    n = prompts.shape[0]
    prompt_len, response_len = columns.get("prompt_len"), columns.get("response_len")
    masks = _numpy(batch["response_mask"]) if "response_mask" in batch.keys() else None
    attention = None if prompt_len is not None and response_len is not None else _numpy(batch["attention_mask"])
    turns = columns.get("__num_turns__")
    extra = columns.get("tool_extra_fields")
    outputs = []
    for i in range(n):
        if attention is None:
            prompt = prompts[i, : int(prompt_len[i])]
            response = responses[i, : int(response_len[i])]
        else:
            width = prompts.shape[1]
            prompt = prompts[i][attention[i, :width].astype(bool)]
            response = responses[i, : int(attention[i, width:].sum())]
        fields = extra[i] if extra is not None else None
        outputs.append(
            {
                "prompt_ids": prompt,
                "response_ids": response,
                "response_mask": None if masks is None else masks[i, : response.shape[0]],
                "num_turns": None if turns is None or turns[i] is None else int(turns[i]),
                "extra_fields": dict(fields) if isinstance(fields, dict) else {},
            }
        )
    return outputs


def dataset_row(data: Any, skipped: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The dataset row of the trajectory in ``data``: every column's value in the last row."""
    sample: dict[str, Any] = {}
    for key, values in data.non_tensor_batch.items():
        if key in PER_OUTPUT_COLUMNS or key in skipped or len(values) == 0:
            continue
        sample[str(key)] = values[-1]
    return sample
