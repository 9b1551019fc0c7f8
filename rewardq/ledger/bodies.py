"""A trajectory frame's body, the bytes after its map, as the decoded form's outputs.

A scored trajectory's body is the records the worker read, byte for byte (the frame's ``rec``
gives their lengths): :func:`outputs_of_records` decodes them into the entries the decoded form
holds. A failure's body is its id arrays (the frame's ``o`` gives each one's length):
:func:`attach_ids` puts them in place. Either way each output's values are checked as they are
taken (:mod:`rewardq.ledger.checks`): a record that does not unpack is damage (ValueError), a
frame or record that unpacks with a wrong field raises :class:`~rewardq.ledger.checks.WrongFrame`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from rewardq.ledger.checks import INT32_MAX, WrongFrame, check_output, got
from rewardq.queue.codec import EXT_INT32, EXT_INT64, EXT_UINT8

#: Where each output's entry of a trajectory frame (``o``) holds its values (rewardq.ledger.frames).
INDEX, FINAL, PROMPT, RESPONSE, MASK, TURNS, EXTRA, ROLLOUT = range(8)
_ID_FIELDS = ((PROMPT, "prompt_ids"), (RESPONSE, "response_ids"), (MASK, "response_mask"))


def outputs_of_records(raw: memoryview, frame: Mapping[str, object]) -> tuple[list[list[Any]], Any]:
    """The decoded form (``o``, ``s``) of the records ``raw`` of ``frame`` (``rec``: each record's
    length; ``si``: which record's sample is the trajectory's, -1 for none): what the worker
    decoded from the same bytes (:func:`~rewardq.queue.codec.decode_output`), as
    :func:`~rewardq.ledger.frames.trajectory_parts` spools it decoded (ids as little-endian int32
    bytes, the mask as uint8). The worker checked every record before it scored it; what is
    checked again is what the rows take as it is. Raises ValueError for a record that does not
    unpack (the disk damaged it), WrongFrame for a wrong field."""
    lengths, sample_at = frame.get("rec"), frame.get("si", -1)
    if type(lengths) is not list or not lengths:
        raise WrongFrame("trajectory", "rec", f"is not a list of record lengths {got(lengths)}")
    if type(sample_at) is not int:
        raise WrongFrame("trajectory", "si", f"is not a record number {got(sample_at)}")
    outputs: list[list[Any]] = []
    sample: Any = {}
    at = 0
    for i, n in enumerate(lengths):
        if type(n) is not int or n < 0 or at + n > len(raw):
            raise WrongFrame("trajectory", "rec", "names more bytes than the frame's records take")
        try:
            d = msgpack.unpackb(raw[at : at + n], raw=False, ext_hook=_Packed, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ValueError(f"a spooled record does not unpack: {type(exc).__name__}: {exc}") from None
        at += n
        try:  # what the worker spools, taken as it is; anything else is explained by _output
            index, final, turns, mask, score = (
                d["index"], d["final"], d.get("num_turns"), d.get("response_mask"), d.get("reward_score")
            )  # fmt: skip
            if (
                type(index) is not int
                or type(final) is not bool
                or not 0 <= index <= INT32_MAX
                or (turns is not None and (type(turns) is not int or not 0 <= turns <= INT32_MAX))
            ):
                raise TypeError
            entry = [
                index,
                final,
                _int32(d["prompt_ids"]),
                _int32(d["response_ids"]),
                None if mask is None else _uint8(mask),
                turns,
                d.get("extra_fields") or {},
                None if score is None else float(score),
            ]
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
            entry = _output(d)  # raises WrongFrame naming the field
        outputs.append(entry)
        if i == sample_at:
            sample = d.get("sample") or {}
            if type(sample) is not dict:
                raise WrongFrame("record", "sample", f"is not a map {got(sample)}")
    if at != len(raw):
        raise WrongFrame("trajectory", "rec", "names fewer bytes than the frame's records take")
    return outputs, sample


def _int32(packed: _Packed) -> bytes:
    """A record's packed ids as little-endian int32 bytes (raises for anything else)."""
    if packed.code == EXT_INT32 and not len(packed.data) & 3:
        return packed.data
    converted: bytes = np.frombuffer(packed.data, _DTYPES[packed.code]).astype("<i4").tobytes()
    return converted


def _uint8(packed: _Packed) -> bytes:
    """A record's packed mask as uint8 bytes (raises for anything else)."""
    if packed.code == EXT_UINT8:
        return packed.data
    converted: bytes = np.frombuffer(packed.data, _DTYPES[packed.code]).astype("u1").tobytes()
    return converted


def _output(d: object) -> list[Any]:
    """A record's entry of the decoded form, each field checked: raises WrongFrame naming the
    first wrong one (the slow path of :func:`outputs_of_records`, for a record it could not take)."""
    if type(d) is not dict:
        raise WrongFrame("record", "<record>", f"is not a map {got(d)}")
    index, final, turns, score = d.get("index"), d.get("final"), d.get("num_turns"), d.get("reward_score")
    check_output("record", index, final, turns, score)
    mask = d.get("response_mask")
    return [
        index,
        final,
        _as(d.get("prompt_ids"), "prompt_ids", "<i4"),
        _as(d.get("response_ids"), "response_ids", "<i4"),
        None if mask is None else _as(mask, "response_mask", "u1"),
        turns,
        d.get("extra_fields") or {},
        None if score is None else float(score),
    ]


class _Packed:
    """A packed array of a record (msgpack ext): its type code and bytes, not decoded."""

    __slots__ = ("code", "data")

    def __init__(self, code: int, data: bytes) -> None:
        self.code, self.data = code, data


_DTYPES: dict[int, np.dtype[Any]] = {EXT_INT32: np.dtype("<i4"), EXT_INT64: np.dtype("<i8"), EXT_UINT8: np.dtype("u1")}
_SAME = {"<i4": EXT_INT32, "u1": EXT_UINT8}


def _as(packed: object, name: str, dtype: str) -> bytes:
    """A record's packed array as ``dtype`` bytes (the bytes themselves when it is that already)."""
    if type(packed) is not _Packed:
        raise WrongFrame("record", name, f"is not a packed array {got(packed)}")
    have = _DTYPES.get(packed.code)
    if have is None or len(packed.data) % have.itemsize:
        raise WrongFrame("record", name, "is not a packed array of whole integers")
    if packed.code == _SAME[dtype]:
        return packed.data
    converted: bytes = np.frombuffer(packed.data, have).astype(dtype).tobytes()
    return converted


def attach_ids(frame: dict[str, Any], raw: memoryview) -> None:
    """Check a decoded-form frame's outputs (``o``) and put each output's id arrays (``raw``: every
    prompt, then every response, then every mask) where its entry names their lengths in bytes,
    and each column's as one run (``frame["ids"]``: per column the view of all its outputs'
    bytes and each output's length, None for a missing mask), which the flusher copies at once."""
    outputs = frame.get("o")
    if type(outputs) is not list or not outputs:
        raise WrongFrame("trajectory", "o", f"is not a list of outputs {got(outputs)}")
    sample = frame.get("s")
    if sample is not None and type(sample) is not dict:
        raise WrongFrame("trajectory", "s", f"is not a map {got(sample)}")
    total = 0
    for out in outputs:
        if type(out) is not list or len(out) != ROLLOUT + 1:
            raise WrongFrame("trajectory", "o", f"holds an output that is not a list of {ROLLOUT + 1} values")
        check_output("trajectory output", out[INDEX], out[FINAL], out[TURNS], out[ROLLOUT])
        if out[ROLLOUT] is not None:
            out[ROLLOUT] = float(out[ROLLOUT])  # as a record's: an int past 2**53 is no double Arrow takes
        for i, name in _ID_FIELDS:
            n = out[i]
            if n is not None and (type(n) is not int or n < 0 or (i != MASK and n % 4)):
                raise WrongFrame("trajectory output", name, f"is not a length of whole int32 ids {got(n)}")
            total += n or 0
    if total != len(raw):
        raise WrongFrame("trajectory", "raw", "is not the length of its outputs' ids")
    at = 0
    runs = []
    for i, _ in _ID_FIELDS:
        start, lengths = at, []
        for out in outputs:
            n = out[i]
            lengths.append(n)
            if n is not None:
                out[i] = raw[at : at + n]
                at += n
        runs.append((raw[start:at], lengths))
    frame["ids"] = runs
