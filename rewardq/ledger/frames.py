"""What a worker writes to its ledger spool for each trajectory, before the trajectory's commit.

A frame is one msgpack map, written as ``<4-byte little-endian length><map>``; a trajectory's
token ids follow its map raw, ``raw`` bytes of them (the map gives each array's length), so they
are written from the arrays' own buffers (one ``writev``) and read back as slices of the
segment, never copied by msgpack. Three kinds:

* ``t``, a trajectory: its outputs (ids as the packed bytes they arrived as), its sample, its
  results exactly as the commit encodes them (:class:`~rewardq.queue.results.EncodedResults` rows
  and their field names, so a field added to the result hash reaches the ledger with no change
  here), the attempt, the timings, the decoded final response and the judge's answers;
* ``c``, a trajectory's commit outcome: whether its commit wrote the result (``committed``);
* ``p``, a provenance blob, written into a segment before the first frame that names it.

Making a frame copies nothing of the ids and decodes nothing: the expensive part, building
columns and writing Parquet, happens later in the ledger's flusher process
(:mod:`rewardq.ledger.flusher`, :mod:`rewardq.ledger.table`), which takes the ids as slices of
the segment it read. Reading stops at a torn last frame (a write
cut by a power loss), which then never counts as written.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from rewardq.queue.codec import OutputRecord

_LEN = struct.Struct("<I")
#: The frame kinds.
TRAJECTORY, OUTCOME, PROVENANCE = "t", "c", "p"


def _ids(array: Any) -> bytes | memoryview | None:
    """An id or mask array's little-endian bytes, without copying when it is contiguous."""
    if array is None:
        return None
    if array.dtype.byteorder == ">" or not array.flags.c_contiguous:
        return bytes(array.astype(array.dtype.newbyteorder("<")).tobytes())
    return memoryview(array).cast("B")


def _output(rec: OutputRecord, raw: tuple[list[object], list[object], list[object]]) -> list[object]:
    """An output's entry of its frame; its id arrays go to ``raw`` (prompts, responses, masks: the
    entry holds their lengths)."""
    mask = rec.response_mask
    arrays = (
        _ids(rec.prompt_ids.astype("<i4", copy=False)),
        _ids(rec.response_ids.astype("<i4", copy=False)),
        None if mask is None else _ids(mask.astype("u1", copy=False)),
    )
    lengths: list[int | None] = []
    for into, a in zip(raw, arrays):
        if a is None:
            lengths.append(None)
        else:
            into.append(a)
            lengths.append(len(a))
    return [rec.index, rec.final, *lengths, rec.num_turns, rec.extra_fields, rec.reward_score]


def stub_record(uid: str, session_id: str, index: int, *, final: bool) -> OutputRecord:
    """A row's identity for a key whose record is not known (no ids, no sample)."""
    empty = np.empty(0, dtype="<i4")
    return OutputRecord(uid, session_id, index, final, empty, empty)


@dataclass
class TrajectoryFacts:
    """What the ledger keeps of one trajectory (see the module doc).

    Attributes:
        records: its outputs, in index order.
        sample: its dataset columns.
        result_fields, result_rows: its results as the commit encodes them: one row for every key
            when they share it, else one per output (:class:`~rewardq.queue.results.EncodedResults`).
        attempt: the scoring attempt.
        put_ts: when the output that completed it was put (unix seconds).
        score_ms: the manager's ``run_single``, in ms (None for a failure).
        provenance: the digest of its provenance blob.
        response: the decoded final response, when the manager decoded it.
        judge: ``[index, request digest, answer JSON]`` of each judge request.
    """

    records: Sequence[OutputRecord]
    sample: Mapping[str, Any]
    result_fields: Sequence[str]
    result_rows: Sequence[Sequence[bytes]]
    attempt: int
    put_ts: float
    score_ms: float | None
    provenance: str
    response: str | None = None
    judge: Sequence[Sequence[Any]] = field(default_factory=list)


def trajectory_frame(ticket: int, t: TrajectoryFacts) -> bytes:
    """The framed bytes of one trajectory, numbered ``ticket`` (its outcome frame names it)."""
    return b"".join(trajectory_parts(ticket, t))


def trajectory_parts(ticket: int, t: TrajectoryFacts) -> list[bytes | memoryview]:
    """:func:`trajectory_frame` as the buffers to write one after the other: the framed map, then
    each id array's own buffer (no copy)."""
    first = t.records[0]
    by_column: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    outputs = [_output(r, by_column) for r in t.records]
    raw: list[bytes | memoryview] = [*by_column[0], *by_column[1], *by_column[2]]  # a column's ids in a row
    body = {
        "k": TRAJECTORY,
        "tk": ticket,
        "u": first.uid,
        "sid": first.session_id,
        "s": t.sample,
        "o": outputs,
        "rf": list(t.result_fields),
        "r": [list(row) for row in t.result_rows],
        "a": t.attempt,
        "ts": t.put_ts,
        "sm": t.score_ms,
        "pv": t.provenance,
        "txt": t.response,
        "j": [list(x) for x in t.judge],
        "raw": sum(len(b) for b in raw),
    }
    return [_framed(body), *raw]


def outcome_frame(ticket: int, committed: bool | None) -> bytes:
    """Whether the commit of the trajectory spooled under ``ticket`` wrote its result."""
    return _framed({"k": OUTCOME, "tk": ticket, "c": committed})


def provenance_frame(digest: str, blob: Mapping[str, object]) -> bytes:
    """A provenance blob, once per segment before a frame names it."""
    return _framed({"k": PROVENANCE, "d": digest, "b": dict(blob)})


def _framed(body: Mapping[str, object]) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True, default=_fallback)
    return _LEN.pack(len(data)) + data


def _fallback(value: object) -> object:
    """What msgpack cannot pack on its own (a tuple packs as a list already): numpy scalars and
    arrays, anything else as its text, so no sample value can fail the spool write."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    return str(value)


def read_frames(data: bytes | memoryview) -> Iterator[dict[str, Any]]:
    """The frames of a spool segment, in order; stops at a torn or undecodable tail."""
    view = memoryview(data)
    pos, end = 0, len(view)
    while pos + _LEN.size <= end:
        (n,) = _LEN.unpack_from(view, pos)
        start = pos + _LEN.size
        if start + n > end:
            return
        try:
            frame = msgpack.unpackb(view[start : start + n], raw=False, strict_map_key=False)
        except (ValueError, msgpack.UnpackException):
            return
        if not isinstance(frame, dict):
            return
        pos = start + n
        raw = frame.get("raw")
        if raw is not None:  # the ids follow the map: slices of the segment, not copies
            if not isinstance(raw, int) or pos + raw > end or not _attach_ids(frame, view[pos : pos + raw]):
                return
            pos += raw
        yield frame


def _attach_ids(frame: dict[str, Any], raw: memoryview) -> bool:
    """Put each output's id arrays (``raw``: every prompt, then every response, then every mask)
    where the frame names their lengths, and each column's whole run as ``ids:<column>`` (the
    ledger's table takes it without a copy)."""
    at = 0
    outputs = frame.get("o") or ()
    for i, column in ((2, "prompt_ids"), (3, "response_ids"), (4, "response_mask")):
        start = at
        for out in outputs:
            n = out[i]
            if n is None:
                continue
            if not isinstance(n, int) or n < 0 or at + n > len(raw):
                return False
            out[i] = raw[at : at + n]
            at += n
        frame[f"ids:{column}"] = raw[start:at]
    return at == len(raw)
