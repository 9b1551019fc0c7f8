"""Build the batch a reward manager receives: one ``TensorDict`` row per output.

Layout: verl's training layout. (verl's reward path right-pads ``prompt+response`` per row
instead and reads a row's length from the widest response, which is wrong whenever the
outputs of a trajectory differ in length.)

* ``prompts``        ``[n, P]`` int64, **left**-padded with 0 to the widest prompt ``P``;
* ``responses``      ``[n, R]`` int64, **right**-padded with 0 to the widest response ``R``;
* ``response_mask``  ``[n, R]`` int64, 1 = model token, 0 = tool/observation token or pad;
* ``attention_mask`` ``[n, P+R]`` int64, ``cat(prompt_mask, response_valid_mask)``;
* ``input_ids``      ``[n, P+R]`` int64, ``cat(prompts, responses)``;
* ``position_ids``   ``[n, P+R]`` int64, ``clamp(cumsum(attention_mask) - 1, min=0)``;
* ``rollout_log_probs`` ``[n, R]`` float32, only when some output carried logprobs;

plus per-row non-tensor fields that survive ``data[-1:]`` and ``data[-1]``: every dataset
column of the sample, ``__num_turns__``, ``tool_extra_fields`` (that output's
``extra_fields``), ``reward_scores`` (the rollout's precomputed reward, ``{}`` if none),
``prompt_len`` and ``response_len``; ``multi_modal_data`` when some output (or the sample) carries
images or video paths: that output's own map, else the sample's column, images as
:class:`~rewardq.queue.images.EncodedImage` (encoded bytes, decoded only when a manager asks).

The valid response of row ``i`` is always ``responses[i, :response_len[i]]``, equal to
``responses[i][attention_mask[i, P:].bool()]``, whatever the other rows' lengths.

Cost (docs/performance.md): the non-tensor columns are built through tensordict's own
flat-stack fast path (the objects ``NonTensorStack.from_list`` builds, ~3x cheaper for
dict values), and :func:`last_row` gives the one-row batch ``data[-1:]`` ~7x cheaper
than TensorDict's general indexing (both in :mod:`rewardq.reward.rows`, which builds the same
objects by hand on tensordict releases without the private helpers, such as verl 0.9.1's 0.10,
once a probe found them equal to the constructors', and takes the public API otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rewardq.errors import TrajectoryTooLarge
from rewardq.queue.codec import OutputRecord
from rewardq.reward import rows as row_readers
from rewardq.reward.rows import copy_value, non_tensor_column

TENSOR_KEYS = ("prompts", "responses", "response_mask", "attention_mask", "input_ids", "position_ids")


def batch_bytes(records: Sequence[OutputRecord]) -> int:
    """The bytes :func:`build_batch` allocates for its tensors, from the outputs' lengths alone.

    ``n`` rows padded to the widest prompt ``P`` and response ``R``: ``prompts`` ``[n, P]``,
    ``responses`` and ``response_mask`` ``[n, R]``, ``attention_mask``, ``input_ids`` and
    ``position_ids`` ``[n, P+R]``, all int64, and ``rollout_log_probs`` ``[n, R]`` float32 when
    some output carried logprobs: ``8n(4P + 5R)`` (+ ``4nR``). Padding multiplies: one long
    output among many short ones makes every row as long.
    """
    n = len(records)
    if n == 0:
        return 0
    P: int = max(r.prompt_ids.shape[0] for r in records)
    R: int = max(r.response_ids.shape[0] for r in records)
    logprobs = any(r.response_logprobs is not None for r in records)
    return 8 * n * (4 * P + 5 * R) + (4 * n * R if logprobs else 0)


def check_batch_bytes(records: Sequence[OutputRecord], limit: int) -> None:
    """Refuse, before anything is allocated, a trajectory whose batch would take more than ``limit``
    (``max_batch_bytes``); raises :class:`~rewardq.errors.TrajectoryTooLarge` naming the sizes."""
    size = batch_bytes(records)
    if size > limit:
        P = max(r.prompt_ids.shape[0] for r in records)
        R = max(r.response_ids.shape[0] for r in records)
        raise TrajectoryTooLarge(
            f"its batch would take {size:,} bytes ({len(records)} outputs padded to {P:,} prompt and {R:,} "
            f"response tokens), over max_batch_bytes={limit:,}; send shorter or fewer outputs, or raise "
            "max_batch_bytes on the workers"
        )


def build_batch(records: Sequence[OutputRecord], sample: Mapping[str, object] | None = None) -> TensorDict:
    """Build the trajectory batch from its outputs, given in index order.

    Args:
        records: the outputs, ``records[i].index == i``.
        sample: the dataset columns shared by all outputs; defaults to the final
            output's ``sample``. Each row gets its own deep copy, so a manager that
            mutates ``extra_info`` never touches another row or the caller's dict.
    """
    n = len(records)
    if n == 0:
        raise ValueError("a trajectory needs at least one output")
    if sample is None:
        sample = records[-1].sample
    plens = [r.prompt_ids.shape[0] for r in records]
    rlens = [r.response_ids.shape[0] for r in records]
    P, R = max(plens), max(rlens)

    logprobs: np.ndarray | None
    if n == 1:
        prompts, responses, response_mask, attention, input_ids, position_ids, logprobs = _one_row(records[0])
    else:
        prompts = np.zeros((n, P), dtype=np.int64)
        responses = np.zeros((n, R), dtype=np.int64)
        response_mask = np.zeros((n, R), dtype=np.int64)
        attention = np.zeros((n, P + R), dtype=np.int64)
        logprobs = np.zeros((n, R), dtype=np.float32) if any(r.response_logprobs is not None for r in records) else None
        for i, r in enumerate(records):
            pl, rl = plens[i], rlens[i]
            if pl:
                prompts[i, P - pl :] = r.prompt_ids
                attention[i, P - pl : P] = 1
            if rl:
                responses[i, :rl] = r.response_ids
                attention[i, P : P + rl] = 1
                response_mask[i, :rl] = 1 if r.response_mask is None else r.response_mask
                if logprobs is not None and r.response_logprobs is not None:
                    logprobs[i, :rl] = r.response_logprobs
        input_ids = np.concatenate([prompts, responses], axis=1)
        # clamp(cumsum(attention_mask) - 1, min=0), without the cumsum: row i counts from 0 at its
        # first prompt id (column P - pl) and stays at its last valid position through the padding
        first = P - np.asarray(plens, dtype=np.int64)
        last = np.maximum(np.asarray(plens, dtype=np.int64) + np.asarray(rlens, dtype=np.int64) - 1, 0)
        position_ids = np.arange(P + R, dtype=np.int64)[None, :] - first[:, None]
        np.maximum(position_ids, 0, out=position_ids)  # in place: np.clip with array bounds costs ~3x
        np.minimum(position_ids, last[:, None], out=position_ids)

    tensors: dict[str, torch.Tensor] = {
        "prompts": torch.from_numpy(prompts),
        "responses": torch.from_numpy(responses),
        "response_mask": torch.from_numpy(response_mask),
        "attention_mask": torch.from_numpy(attention),
        "input_ids": torch.from_numpy(input_ids),
        "position_ids": torch.from_numpy(position_ids),
    }
    if logprobs is not None:
        tensors["rollout_log_probs"] = torch.from_numpy(logprobs)

    rows: dict[str, list[Any]] = {
        col: [copy_value(val) for _ in range(n)] for col, val in sample.items() if col not in tensors
    }
    rows["__num_turns__"] = [r.num_turns for r in records]
    rows["tool_extra_fields"] = [dict(r.extra_fields) for r in records]
    rows["reward_scores"] = [{} if r.reward_score is None else {"reward_score": r.reward_score} for r in records]
    if any(r.multi_modal_data for r in records):  # else absent, or the sample's column as it is
        shared = rows.get("multi_modal_data")
        rows["multi_modal_data"] = [r.multi_modal_data or (shared[i] if shared else {}) for i, r in enumerate(records)]
    rows["prompt_len"] = plens
    rows["response_len"] = rlens
    columns: dict[Any, Any] = dict(tensors)
    for col, values in rows.items():
        columns[col] = non_tensor_column(values)
    if not row_readers.FAST_PATH:
        return TensorDict(columns, batch_size=[n])
    # every column was built above with batch size [n] on the CPU: skip the constructor's checks
    return TensorDict._new_unsafe(columns, batch_size=torch.Size([n]))


def _one_row(r: OutputRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any]:
    """The tensors of a one-output batch (the final row a built-in manager reads): nothing to pad,
    so each is one conversion of the record's own array instead of a zeroed array filled by slices."""
    pl, rl = r.prompt_ids.shape[0], r.response_ids.shape[0]
    prompts = r.prompt_ids.astype(np.int64).reshape(1, pl)
    responses = r.response_ids.astype(np.int64).reshape(1, rl)
    mask = np.ones((1, rl), dtype=np.int64) if r.response_mask is None else r.response_mask.astype(np.int64)
    attention = np.ones((1, pl + rl), dtype=np.int64)
    input_ids = np.concatenate([prompts, responses], axis=1)
    position_ids = np.arange(pl + rl, dtype=np.int64).reshape(1, pl + rl)
    logprobs = None if r.response_logprobs is None else r.response_logprobs.astype(np.float32).reshape(1, rl)
    return prompts, responses, mask.reshape(1, rl), attention, input_ids, position_ids, logprobs
