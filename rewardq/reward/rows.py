"""Row readers: what a reward manager reads from the batch of one trajectory.

A manager's ``run_single`` receives a ``TensorDict`` with one row per output (the layout is
documented in :mod:`rewardq.consumers.batch`, which builds it). These helpers read one
row (``data[i]``, or a one-row batch such as ``data[-1:]``)::

    from rewardq.reward import last_row, non_tensor, valid_response_ids

    row = last_row(data)                        # data[-1:], cheaper
    ids = valid_response_ids(row)               # unpadded response token ids
    truth = non_tensor(row, "reward_model")["ground_truth"]

They work on tensordict 0.10 and later. :func:`last_row` and :func:`non_tensor_column` use
tensordict's flat-stack fast path (``tensordict.tensorclass._flat_ntd`` / ``_init_flat``,
private) where it exists (0.15). Where it does not (0.10, verl 0.9.1's pin), they build the
same objects by hand (:func:`_ntd_by_hand`, ``NonTensorStack._new_lazy_unsafe``) when a probe
at import finds them equal, attribute for attribute, to what the public constructors build;
otherwise they take the public ``NonTensorStack`` API (``FAST_PATH`` says whether a fast path
is in use; the test suite runs both).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

# tensordict's flat-stack fast path (0.15): the objects NonTensorStack.from_list builds. Private
# helpers, looked up by name; a release without them (0.10) gets the by-hand builders below.
_tensorclass = importlib.import_module("tensordict.tensorclass")
_flat_ntd: Any = getattr(_tensorclass, "_flat_ntd", None)
_init_flat: Any = getattr(_tensorclass, "_init_flat", None)


def _ntd_by_hand(value: object, device: torch.device | None) -> NonTensorData:
    """``NonTensorData(data=value)`` built directly, as tensordict 0.15's ``_flat_ntd`` does: on
    tensordict 0.10 the constructor costs ~10 µs, most of a one-row batch's build."""
    result = NonTensorData.__new__(NonTensorData)
    setattr_ = object.__setattr__  # not writes to __dict__: reading it slows every later attribute read
    setattr_(result, "_tensordict", TensorDict._new_unsafe({}, batch_size=torch.Size([]), device=device))
    setattr_(result, "_non_tensordict", {"data": value, "_metadata": None, "_is_non_tensor": True})
    setattr_(result, "_is_initialized", True)
    return result


def _stack_by_hand(members: list[NonTensorData]) -> NonTensorStack:
    """``NonTensorStack(*members)``, through tensordict's own unchecked lazy stack (0.10)."""
    new_lazy: Any = NonTensorStack._new_lazy_unsafe  # typed for tensordicts, not their non-tensor members
    column: NonTensorStack = new_lazy(*members, stack_dim=0)
    return column


def _stack_by_flat_init(members: list[NonTensorData]) -> NonTensorStack:
    """``NonTensorStack(*members)`` for plain members, through tensordict's flat-stack fast path (0.15)."""
    column = NonTensorStack.__new__(NonTensorStack)
    _init_flat(column, members)
    return column


def _state(obj: object) -> dict[str, object]:
    """An object's attributes as a comparable map: nested tensordicts by their own attributes."""
    out: dict[str, object] = {}
    for key, value in vars(obj).items():
        if isinstance(value, (TensorDict, NonTensorData)):
            out[key] = (type(value), _state(value))
        elif isinstance(value, list):
            out[key] = [(type(v), _state(v)) for v in value]
        else:
            out[key] = (type(value), value)
    return out


def _by_hand_matches() -> bool:
    """Whether the by-hand builders make what the public constructors make (dicts, lists, scalars)."""
    try:
        for value in ({"a": [1, 2]}, [{"role": "user"}], "x", 3, None):
            public = NonTensorStack(NonTensorData(data=value))
            column = _stack_by_hand([_ntd_by_hand(value, None)])
            if _state(column) != _state(public) or column.tolist() != public.tolist():
                return False
        return True
    except Exception:  # noqa: BLE001 - any difference in tensordict's internals: the public path
        return False


_flat_stack: Callable[[list[NonTensorData]], NonTensorStack] = _stack_by_flat_init
if _init_flat is None:
    _flat_ntd = None
    if _by_hand_matches():
        _flat_ntd, _flat_stack = _ntd_by_hand, _stack_by_hand

#: True when a flat-stack fast path is in use: tensordict's private helpers, or the by-hand
#: builders where a probe found them equal to the public constructors (see the module doc).
FAST_PATH = _flat_ntd is not None

_MISSING = object()


def _plain_data(member: object) -> Any:
    """The value of a ``NonTensorData`` without batch dimensions, read from the attributes that hold
    it (``_non_tensordict["data"]`` beside an empty ``_tensordict``, in tensordict 0.10 and 0.15),
    or ``_MISSING`` for anything else. ``member.data`` and ``member.batch_size`` go through
    tensorclass's attribute machinery: ~4 µs each on tensordict 0.10, a read's whole cost."""
    if type(member) is not NonTensorData:
        return _MISSING
    attrs = member.__dict__
    inner, fields = attrs.get("_tensordict"), attrs.get("_non_tensordict")
    if type(inner) is not TensorDict or inner.batch_dims or type(fields) is not dict or "data" not in fields:
        return _MISSING
    return fields["data"]


def _plain_data_matches() -> bool:
    """Whether :func:`_plain_data` reads what ``.data`` gives, for members made both ways."""
    try:
        for value in ({"a": [1, 2]}, [{"role": "user"}], "x", 3, None):
            for member in (NonTensorData(data=value), NonTensorStack(NonTensorData(data=value)).tensordicts[0]):
                if _plain_data(member) is not member.data or member.batch_size:
                    return False
        return True
    except Exception:  # noqa: BLE001 - any difference in tensordict's internals: the public reads
        return False


#: True when a probe found :func:`_plain_data` equal to tensordict's own reads (see there).
DIRECT_READS = _plain_data_matches()


def _direct(member: object) -> Any:
    """:func:`_plain_data` where the probe allowed it (``DIRECT_READS``), else ``_MISSING``."""
    return _plain_data(member) if DIRECT_READS else _MISSING


__all__ = [
    "copy_value",
    "last_row",
    "non_tensor",
    "non_tensor_column",
    "valid_prompt_ids",
    "valid_response_ids",
]


def non_tensor_column(values: list[object]) -> NonTensorStack:
    """A per-row non-tensor column: ``column[i]`` is ``values[i]``, as ``NonTensorStack.from_list``.

    A value that is itself a list (``raw_prompt``'s chat messages) stays one plain list
    (``from_list`` would nest it as a stack of its items).
    """
    if not FAST_PATH:
        return NonTensorStack(*[NonTensorData(data=v) for v in values])
    return _flat_stack([_flat_ntd(v, None) for v in values])


def last_row(data: TensorDict) -> TensorDict:
    """The final row as a one-row batch: what ``data[-1:]`` returns, built ~7x cheaper.

    Tensors are views (as with ``data[-1:]``); a non-tensor column holds the very element
    of ``data`` (a lazy stack's slice shares it too). Anything but a flat batch of tensors
    and flat non-tensor stacks takes ``data[-1:]``.
    """
    n = data.batch_size[0] if data.batch_dims == 1 else 0
    if n == 1:
        return data
    if not FAST_PATH or n == 0 or type(data) is not TensorDict:
        return data[-1:]
    columns: dict[Any, Any] = {}
    for key, value in data.items():
        if isinstance(value, torch.Tensor):
            columns[key] = value[n - 1 :]
        elif type(value) is NonTensorStack and value.stack_dim == 0 and len(value.tensordicts) == n:
            columns[key] = _flat_stack([value.tensordicts[-1]])
        else:
            return data[-1:]
    return TensorDict._new_unsafe(columns, batch_size=torch.Size([1]), device=data.device)


def copy_value(value: object) -> Any:
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
        length = int(attention[attention.shape[-1] - responses.shape[-1] :].sum())
    return responses[:length]


def valid_prompt_ids(row: TensorDict) -> torch.Tensor:
    """The valid (unpadded) prompt ids of one row: prompts are left-padded."""
    prompts = _row_tensor(row, "prompts")
    width = prompts.shape[-1]
    length = _length(row, "prompt_len")
    if length is None:
        length = int(_row_tensor(row, "attention_mask")[:width].sum())
    return prompts[width - length :]


def _row_tensor(row: TensorDict, name: str) -> torch.Tensor:
    """A tensor column of one row: ``data[i]``'s as it is, a one-row batch's first row."""
    value: torch.Tensor = row.get(name)
    return value[0] if row.batch_dims == 1 else value


def _length(row: TensorDict, name: str) -> int | None:
    """A row's ``prompt_len`` / ``response_len`` column (ints by construction), or None when
    the row has no such column or it holds something else (a hand-built batch)."""
    value = row.get(name, None)
    if type(value) is NonTensorStack and len(value.tensordicts) == 1:
        value = value.tensordicts[0]
    if type(value) is NonTensorData:
        plain = _direct(value)
        value = value.data if plain is _MISSING else plain
    return value if type(value) is int and value >= 0 else None


def non_tensor(row: TensorDict, name: str, default: object = None) -> Any:
    """A per-row non-tensor field of one row (``data[i]`` or ``data[-1:]``), or ``default``."""
    value = row.get(name, None)
    if value is None:
        return default
    if isinstance(value, NonTensorData):  # one value for every row (``set_non_tensor``)
        return value.data
    if row.batch_dims == 1:
        if type(value) is NonTensorStack:
            members = value.tensordicts
            if len(members) == 1:  # a one-row column (what build_batch makes): tolist()[0], ~5x cheaper
                plain = _direct(members[0])
                if plain is not _MISSING:
                    return plain
                if type(members[0]) is NonTensorData and not members[0].batch_size:
                    return members[0].data
        values = value.tolist() if isinstance(value, NonTensorStack) else value
        if len(values) != 1:
            raise ValueError("non_tensor takes one row: data[i] or data[-1:]")
        return values[0]
    return value
