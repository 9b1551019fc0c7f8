"""Token ids, response masks and logprobs as producers hand them over (Python lists, numpy
arrays, torch tensors), turned into the checked, contiguous arrays the wire format packs
(:mod:`rewardq.queue.codec`): int32 ids, uint8 masks, float32 logprobs. Each failure raises
:class:`~rewardq.errors.RecordError` naming the field.

Lists of Python ints are packed in C (``array``) before numpy sees them: verl's agent loop hands
ids and masks over as lists, and this is the producer's hot path.
"""

from __future__ import annotations

import array
import sys
from typing import Any

import numpy as np

from rewardq.errors import RecordError
from rewardq.queue.checks import check_finite, check_mask

__all__ = ["MAX_TOKEN_ID", "as_id_array", "as_logprobs", "as_mask"]

#: Token ids must fit in int32; vocabularies are far smaller.
MAX_TOKEN_ID = 2**31 - 1


def as_id_array(value: object, name: str, *, vocab_size: int | None = None) -> np.ndarray:
    """Turn a list / numpy array / torch tensor of token ids into a contiguous int32 array.

    Raises RecordError naming ``name`` for non-integers, other than 1-D shapes, negative ids
    and ids at or above ``vocab_size`` (or int32's range when no vocabulary is known).
    """
    if value is None:
        raise RecordError(name, "is required (a list, numpy array or torch tensor of token ids)")
    if type(value) is list:
        packed = _packed_list(value, "<I", "<i4")
        if packed is not None and vocab_size is None:
            return packed  # packed as uint32 and read back as non-negative int32: every check holds
        if packed is not None:
            value = packed  # the checks below then run on the array: no Python-level loop at all
    elif hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor, without importing torch
        value = value.detach().cpu().numpy()
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        raise RecordError(name, f"expected a sequence of integer token ids, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise RecordError(name, f"cannot be read as an array of token ids ({exc})") from None
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.ndim != 1:
        raise RecordError(name, f"expected a 1-D sequence of token ids, got shape {tuple(arr.shape)}")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise RecordError(name, f"expected integer token ids, got {arr.dtype} values")
    lo, hi = int(arr.min()), int(arr.max())
    limit = vocab_size if vocab_size is not None else MAX_TOKEN_ID + 1
    if lo < 0:
        raise RecordError(name, f"token id {lo} is negative")
    if hi >= limit:
        what = f"the vocabulary size {vocab_size}" if vocab_size is not None else "int32's range"
        raise RecordError(name, f"token id {hi} is out of range (must be below {what})")
    return np.ascontiguousarray(arr, dtype="<i4")


#: The ``array`` type code of a 4-byte unsigned integer on this platform.
_UINT32 = next(code for code in "IL" if array.array(code).itemsize == 4)


def _packed_list(value: list[Any], fmt: str, dtype: str) -> np.ndarray | None:
    """A list of Python ints as an array, packed in C (``array``; ``bytearray`` for ``"B"``): ~10x
    cheaper than ``np.asarray`` for ids, more for a mask (verl's agent loop hands both over as
    lists). None when the list holds anything else or a value out of the format's range: the
    numpy path then converts it, or names what is wrong."""
    if not value or type(value[0]) is not int:  # bools, floats, numpy scalars: the numpy path
        return None
    try:
        if fmt == "B":
            # bytearray(list) takes ~1.7 ns an item against bytes(list)'s ~4.3 (CPython 3.11): the
            # same bytes and the same refusals (ValueError past 255, TypeError for a non-integer)
            raw: bytearray | array.array[int] = bytearray(value)
        else:
            raw = array.array(_UINT32, value)  # no argument tuple, unlike struct.pack(*value)
            if sys.byteorder == "big":
                raw.byteswap()
    except (OverflowError, ValueError, TypeError):
        return None
    arr = np.frombuffer(raw, dtype=dtype)
    # an unsigned id of 2**31 or more reads as negative int32: the numpy path names it out of range
    return arr if fmt == "B" or int(arr.min()) >= 0 else None


def as_mask(value: object, n: int) -> np.ndarray | None:
    """``response_mask`` (a list, numpy array or torch tensor of 0/1, ``n`` long) as a uint8 array; None stays None."""
    if value is None:
        return None
    if type(value) is list:
        packed = _packed_list(value, "B", "u1")
        if packed is not None and packed.shape[0] == n and (n == 0 or int(packed.max()) <= 1):
            return packed
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise RecordError("response_mask", f"cannot be read as an array of 0/1 values ({exc})") from None
    if arr.size == 0:
        arr = np.zeros(0, dtype=np.uint8)
    if arr.ndim != 1:
        raise RecordError("response_mask", f"expected a 1-D sequence of 0/1 values, got shape {tuple(arr.shape)}")
    if arr.dtype != np.bool_ and not np.issubdtype(arr.dtype, np.integer):
        raise RecordError("response_mask", f"expected integer 0/1 values, got {arr.dtype} values")
    return check_mask(arr.astype(np.int64, copy=False) if arr.dtype == np.bool_ else arr, n)


def as_logprobs(value: object, n: int) -> np.ndarray | None:
    """``response_logprobs`` (``n`` finite numbers) as a float32 array; None stays None."""
    if value is None:
        return None
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value, dtype="<f4").reshape(-1)
    except (TypeError, ValueError) as exc:
        raise RecordError("response_logprobs", f"must be numbers ({exc})") from None
    if arr.shape[0] != n:
        raise RecordError("response_logprobs", f"has {arr.shape[0]} entries but response_ids has {n}")
    check_finite(arr)
    return arr
