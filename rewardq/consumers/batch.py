"""Build the batch a reward manager receives: one ``TensorDict`` row per output.

Layout (REFERENCE §2, verl's training layout, which the reference's own reward path
gets wrong when outputs differ in length):

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
``prompt_len`` and ``response_len``.

The valid response of row ``i`` is always ``responses[i, :response_len[i]]``, equal to
``responses[i][attention_mask[i, P:].bool()]``, whatever the other rows' lengths.

Cost (benchmarks/PROFILE.md): the non-tensor columns are built through tensordict's own
flat-stack fast path (the objects ``NonTensorStack.from_list`` builds, ~3x cheaper for
dict values), and :func:`last_row` gives the one-row batch ``data[-1:]`` ~7x cheaper
than TensorDict's general indexing. Both fall back to the public API when a tensordict
release no longer has the helpers.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Sequence

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from rewardq.queue.codec import OutputRecord

try:  # tensordict's flat-stack fast path (0.15): same objects as NonTensorStack.from_list
    from tensordict.tensorclass import _flat_ntd, _init_flat
except ImportError:  # pragma: no cover - other tensordict releases take the public path
    _flat_ntd = _init_flat = None

warnings.filterwarnings("ignore", message=".*non-writable.*", category=UserWarning)

TENSOR_KEYS = ("prompts", "responses", "response_mask", "attention_mask", "input_ids", "position_ids")


def build_batch(records: Sequence[OutputRecord], sample: dict | None = None) -> TensorDict:
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

    prompts = np.zeros((n, P), dtype=np.int64)
    responses = np.zeros((n, R), dtype=np.int64)
    response_mask = np.zeros((n, R), dtype=np.int64)
    attention = np.zeros((n, P + R), dtype=np.int64)
    logprobs = np.zeros((n, R), dtype=np.float32) if any(r.response_logprobs is not None for r in records) else None
    for i, r in enumerate(records):
        pl, rl = plens[i], rlens[i]
        if pl:
            prompts[i, P - pl:] = r.prompt_ids
            attention[i, P - pl:P] = 1
        if rl:
            responses[i, :rl] = r.response_ids
            attention[i, P:P + rl] = 1
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

    rows: dict[str, list[Any]] = {col: [copy_value(val) for _ in range(n)] for col, val in sample.items()
                                  if col not in tensors}
    rows["__num_turns__"] = [r.num_turns for r in records]
    rows["tool_extra_fields"] = [dict(r.extra_fields) for r in records]
    rows["reward_scores"] = [{} if r.reward_score is None else {"reward_score": r.reward_score} for r in records]
    rows["prompt_len"] = plens
    rows["response_len"] = rlens
    columns: dict[str, Any] = dict(tensors)
    for col, values in rows.items():
        columns[col] = non_tensor_column(values)
    if _init_flat is None:
        return TensorDict(columns, batch_size=[n])
    # every column was built above with batch size [n] on the CPU: skip the constructor's checks
    return TensorDict._new_unsafe(columns, batch_size=torch.Size([n]))


def non_tensor_column(values: list[Any]) -> NonTensorStack:
    """A per-row non-tensor column: ``column[i]`` is ``values[i]``, as ``NonTensorStack.from_list``.

    A value that is itself a list (``raw_prompt``'s chat messages) stays one plain list
    (``from_list`` would nest it as a stack of its items).
    """
    if _init_flat is None:
        return NonTensorStack(*[NonTensorData(data=v) for v in values])
    return _flat_stack([_flat_ntd(v, None) for v in values])


def _flat_stack(members: list[NonTensorData]) -> NonTensorStack:
    """``NonTensorStack(*members)`` for plain members, through tensordict's flat-stack fast path."""
    column = NonTensorStack.__new__(NonTensorStack)
    _init_flat(column, members)
    return column


def last_row(data: TensorDict) -> TensorDict:
    """The final row as a one-row batch: what ``data[-1:]`` returns, built ~7x cheaper.

    Tensors are views (as with ``data[-1:]``); a non-tensor column holds the very element
    of ``data`` (a lazy stack's slice shares it too). Anything but a flat batch of tensors
    and flat non-tensor stacks takes ``data[-1:]``.
    """
    n = data.batch_size[0] if data.batch_dims == 1 else 0
    if n == 1:
        return data
    if _init_flat is None or n == 0 or type(data) is not TensorDict:
        return data[-1:]
    columns: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, torch.Tensor):
            columns[key] = value[n - 1:]
        elif type(value) is NonTensorStack and value.stack_dim == 0 and len(value.tensordicts) == n:
            columns[key] = _flat_stack([value.tensordicts[-1]])
        else:
            return data[-1:]
    return TensorDict._new_unsafe(columns, batch_size=torch.Size([1]), device=data.device)


def copy_value(value: Any) -> Any:
    """A deep copy of a decoded value: dicts, lists and scalars by hand (~3x cheaper than
    ``copy.deepcopy``), anything else through ``copy.deepcopy``."""
    if isinstance(value, dict):
        return {k: copy_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_value(v) for v in value]
    if isinstance(value, (str, int, float, bool, bytes)) or value is None:
        return value
    return copy.deepcopy(value)


def valid_response_ids(row: TensorDict) -> torch.Tensor:
    """The valid response ids of one row (``data[i]``, or a one-row batch ``data[-1:]``).

    Responses are right-padded, so the valid ones are the first ``response_len`` (the
    row's own column; without it, ``attention_mask[P:].sum()``): a slice, where
    boolean-mask indexing costs ~70x more.
    """
    if row.batch_dims == 1 and row.batch_size[0] != 1:
        raise ValueError("valid_response_ids takes one row: data[i] or data[-1:]")
    responses = _row_tensor(row, "responses")
    length = _length(row, "response_len")
    if length is None:
        attention = _row_tensor(row, "attention_mask")
        length = int(attention[attention.shape[-1] - responses.shape[-1]:].sum())
    return responses[:length]


def valid_prompt_ids(row: TensorDict) -> torch.Tensor:
    """The valid (unpadded) prompt ids of one row: prompts are left-padded."""
    prompts = _row_tensor(row, "prompts")
    width = prompts.shape[-1]
    length = _length(row, "prompt_len")
    if length is None:
        length = int(_row_tensor(row, "attention_mask")[:width].sum())
    return prompts[width - length:]


def _row_tensor(row: TensorDict, name: str) -> torch.Tensor:
    """A tensor column of one row: ``data[i]``'s as it is, a one-row batch's first row."""
    value = row.get(name)
    return value[0] if row.batch_dims == 1 else value


def _length(row: TensorDict, name: str) -> int | None:
    """A row's ``prompt_len`` / ``response_len`` column (ints by construction), or None when
    the row has no such column or it holds something else (a hand-built batch)."""
    value = row.get(name, None)
    if type(value) is NonTensorStack and len(value.tensordicts) == 1:
        value = value.tensordicts[0]
    if type(value) is NonTensorData:
        value = value.data
    return value if type(value) is int and value >= 0 else None


def non_tensor(row: TensorDict, name: str, default: Any = None) -> Any:
    """A per-row non-tensor field of one row (``data[i]`` or ``data[-1:]``), or ``default``."""
    value = row.get(name, None)
    if value is None:
        return default
    if isinstance(value, NonTensorData):  # one value for every row (``set_non_tensor``)
        return value.data
    if row.batch_dims == 1:
        values = value.tolist() if isinstance(value, NonTensorStack) else value
        if len(values) != 1:
            raise ValueError("non_tensor takes one row: data[i] or data[-1:]")
        return values[0]
    return value
