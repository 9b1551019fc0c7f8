"""What a worker writes to its ledger spool for each trajectory, before the trajectory's commit.

A frame is one msgpack map, written as ``<4-byte little-endian length><map>``, followed by
``raw`` bytes the map describes, written from their own buffers (one ``writev``). Three kinds:

* ``t``, a trajectory: its outputs, its sample, its results exactly as the commit encodes them
  (:class:`~rewardq.queue.results.EncodedResults` rows and their field names, so a field added to
  the result hash reaches the ledger with no change here), the attempt, the timings, the decoded
  final response and the judge's answers. Its outputs come in one of two forms:

  - **as the records the worker read** (``rec``: each record's length; the records follow the
    map byte for byte, as they came from Redis; ``si``: which record's sample is the
    trajectory's, -1 for none). The worker writes a scored trajectory this way: it copies
    nothing and encodes nothing of it, and the flusher decodes the records
    (:func:`~rewardq.ledger.bodies.outputs_of_records`) into what the other form holds. Records with images are never
    spooled this way (their images are not kept, and can be large);
  - **decoded** (``o``: per output its index, final flag, the lengths of its prompt ids,
    response ids and mask, its turns, extra fields and precomputed reward; ``s``: the sample;
    the id arrays follow the map as raw little-endian bytes, every prompt, then every response,
    then every mask, so the flusher copies a column's ids of a trajectory at once). Failures
    are spooled this way (their records may not have decoded). Scored trajectories are not:
    packing their outputs' entries and sample, and writing ~3 buffers per output instead of one,
    cost the worker ~12 µs per trajectory to save the flusher ~20 (docs/performance.md).

* ``c``, a trajectory's commit outcome: whether its commit wrote the result (``committed``);
* ``p``, a provenance blob, written into a segment before the first frame that names it.

Making a frame copies nothing of the ids and decodes nothing: the expensive part, decoding,
building columns and writing Parquet, happens later in the ledger's flusher process
(:mod:`rewardq.ledger.flusher`, :mod:`rewardq.ledger.table`). :func:`read_frames` gives both
forms as the decoded one, so a row never depends on the form its trajectory was spooled in.
Reading stops at a torn last frame (a write cut by a power loss), which then never counts as
written. :class:`SegmentFile` also tells such a tail from damage (:class:`Skipped`).
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from rewardq.ledger.bodies import attach_ids, outputs_of_records
from rewardq.ledger.checks import WrongFrame
from rewardq.queue.codec import OutputRecord

_LEN = struct.Struct("<I")
#: The frame kinds.
TRAJECTORY, OUTCOME, PROVENANCE = "t", "c", "p"


_I4, _U1 = np.dtype("<i4"), np.dtype("u1")


def _packed(array: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``array`` as contiguous ``dtype`` (little-endian), itself when it is already (the usual
    case: no copy; the spool writes it from its own buffer)."""
    if array.dtype == dtype and array.flags.c_contiguous:
        return array
    return np.ascontiguousarray(array, dtype=dtype)


def _output(rec: OutputRecord, raw: tuple[list[object], list[object], list[object]]) -> list[object]:
    """An output's entry of its frame; its id arrays go to ``raw`` (prompts, responses, masks: the
    entry holds their lengths in bytes)."""
    prompt, response, mask = _packed(rec.prompt_ids, _I4), _packed(rec.response_ids, _I4), rec.response_mask
    raw[0].append(prompt)
    raw[1].append(response)
    if mask is not None:
        mask = _packed(mask, _U1)
        raw[2].append(mask)
    return [
        rec.index,
        rec.final,
        prompt.nbytes,
        response.nbytes,
        None if mask is None else mask.nbytes,
        rec.num_turns,
        rec.extra_fields,
        rec.reward_score,
    ]


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
        payloads: the records' bytes as the worker read them (``records`` decoded from them, in
            the same order), when it holds them: the frame then carries them as they are.
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
    payloads: Sequence[bytes] | None = None


def trajectory_frame(ticket: int, t: TrajectoryFacts) -> bytes:
    """The framed bytes of one trajectory, numbered ``ticket`` (its outcome frame names it)."""
    parts: list[Any] = trajectory_parts(ticket, t)  # buffers (numpy's stubs do not say so)
    return b"".join(parts)


#: What a frame is written from: its map's bytes, records as read, or id arrays (any C-contiguous
#: buffer; :func:`part_bytes` gives its length in bytes).
Part = bytes | bytearray | memoryview | np.ndarray


def part_bytes(part: Part) -> int:
    """The length of ``part`` in bytes."""
    return len(part) if isinstance(part, (bytes, bytearray)) else part.nbytes


def trajectory_parts(ticket: int, t: TrajectoryFacts) -> list[Part]:
    """:func:`trajectory_frame` as the buffers to write one after the other: the framed map, then
    the records as they were read, or each id array's own buffer (no copy either way)."""
    sample_at = _sample_index(t)
    if sample_at is not None and t.payloads is not None:
        lengths = [len(p) for p in t.payloads]
        return [_trajectory_map(ticket, t, {"si": sample_at, "rec": lengths}, sum(lengths)), *t.payloads]
    by_column: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    outputs = [_output(r, by_column) for r in t.records]
    raw: list[Part] = [*by_column[0], *by_column[1], *by_column[2]]  # a column's ids in a row
    return [_trajectory_map(ticket, t, {"s": t.sample, "o": outputs}, sum(map(part_bytes, raw))), *raw]


def _trajectory_map(ticket: int, t: TrajectoryFacts, outputs: Mapping[str, object], raw: int) -> bytes:
    """A trajectory frame's map: ``outputs`` in one of its two forms, ``raw`` bytes following it."""
    first = t.records[0]
    return _framed(
        {
            "k": TRAJECTORY,
            "tk": ticket,
            "u": first.uid,
            "sid": first.session_id,
            **outputs,
            "rf": list(t.result_fields),
            "r": [list(row) for row in t.result_rows],
            "a": t.attempt,
            "ts": t.put_ts,
            "sm": t.score_ms,
            "pv": t.provenance,
            "txt": t.response,
            "j": [list(x) for x in t.judge],
            "raw": raw,
        }
    )


def _sample_index(t: TrajectoryFacts) -> int | None:
    """Which record's sample is ``t.sample`` (-1: it is empty), when ``t`` can be spooled as the
    records it was read as; None when it cannot (no payloads, images, or a sample of its own)."""
    payloads, records = t.payloads, t.records
    if payloads is None or len(payloads) != len(records):
        return None
    if any(r.multi_modal_data is not None or "multi_modal_data" in r.sample for r in records):
        return None
    if not t.sample:
        return -1
    for i in range(len(records) - 1, -1, -1):
        if records[i].sample is t.sample:
            return i
    return None


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
    """The frames of a spool segment held in memory, in order; stops at a torn or undecodable tail,
    and leaves out a trajectory frame whose body cannot be read or whose outputs are wrong."""
    view = memoryview(data)
    pos, end = 0, len(view)
    while True:
        got = _map_at(view[pos:], pos, end)
        if got is None:
            return
        frame, start, raw = got
        pos = start + raw
        try:
            if frame.get("k") == TRAJECTORY and not _complete(frame, view[start:pos]):
                continue
        except WrongFrame:
            continue
        yield frame


def _map_at(head: memoryview, pos: int, end: int) -> tuple[dict[str, Any], int, int] | None:
    """The frame whose map starts ``head`` (at ``pos`` of a segment of ``end`` bytes): the map,
    where the bytes following it start and how many there are; None when the segment ends here,
    torn or undecodable (``head`` must hold at least the length prefix and the map when they fit)."""
    if pos + _LEN.size > end or len(head) < _LEN.size:
        return None
    (n,) = _LEN.unpack_from(head, 0)
    start = pos + _LEN.size + n
    if start > end or len(head) < _LEN.size + n:
        return None
    try:
        frame = msgpack.unpackb(head[_LEN.size : _LEN.size + n], raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException):  # TypeError: a map key that is a map
        return None
    if not isinstance(frame, dict):
        return None
    raw = frame.get("raw")
    if raw is None:
        return frame, start, 0
    if not isinstance(raw, int) or raw < 0 or start + raw > end:
        return None
    return frame, start, raw


def _complete(frame: dict[str, Any], body: memoryview) -> bool:
    """Give trajectory ``frame`` its outputs from the ``body`` that follows its map (False: its
    records do not unpack; the frame is then skipped and the frames after it are whole). Raises
    :class:`~rewardq.ledger.checks.WrongFrame` for a frame, output or record with a wrong field."""
    if "raw" not in frame:
        raise WrongFrame("trajectory", "raw", "(missing)")
    if "rec" not in frame:
        attach_ids(frame, body)
        return True
    try:
        frame["o"], frame["s"] = outputs_of_records(body, frame)
    except ValueError:  # its bytes damaged on disk
        return False
    frame.pop("ids", None)  # the decoded form's runs of ids: the rows take these outputs' own
    return True


#: Bytes read at once while looking for the frames' maps: one page, which holds a trajectory's map
#: (~0.7 KB for the benchmark's workload) and the commit outcome before it; a larger map is read
#: whole by a second read. More would copy record bytes the first pass skips.
_MAP_READ = 1 << 12


class SegmentFile:
    """A spool segment on disk, read in pieces rather than whole: :meth:`frames` finds the maps,
    :meth:`complete` reads one frame's body into a buffer kept from frame to frame (and from
    segment to segment: :data:`_BODY`), so a segment costs one trajectory's bytes of memory, not
    its size. Each piece is one ``pread`` (no seek, and nothing copied by a Python file buffer)."""

    def __init__(self, f: io.BufferedIOBase) -> None:
        self.fd = f.fileno()
        self.size = os.fstat(self.fd).st_size
        #: Set once :meth:`frames` ended: bytes of a torn last frame, and unreadable bytes (damage).
        self.torn = self.unreadable = 0

    def frames(self) -> Iterator[tuple[dict[str, Any], int, int]]:
        """Each frame's map in order, where its body starts and its length; stops where
        :func:`read_frames` stops (a frame whose records do not decode is found by :meth:`complete`),
        and then sorts what follows the last whole frame into :attr:`torn` or :attr:`unreadable`."""
        pos, got_at, got = 0, 0, memoryview(b"")  # got: the bytes read last, from got_at
        while True:
            head = got[pos - got_at :] if got_at <= pos <= got_at + len(got) else memoryview(b"")
            if len(head) < _LEN.size or _LEN.size + _LEN.unpack_from(head, 0)[0] > len(head):
                got_at, got = pos, self._read(pos)
                head = got
            found = _map_at(head, pos, self.size)
            if found is None:
                if pos < self.size:
                    left = self.size - pos
                    self.torn, self.unreadable = (left, 0) if _cut_short(self.fd, pos, self.size) else (0, left)
                return
            frame, start, raw = found
            yield frame, start, raw
            pos = start + raw

    def _read(self, pos: int) -> memoryview:
        """The bytes from ``pos``: at least :data:`_MAP_READ`, and the whole map there when it fits."""
        data = os.pread(self.fd, _MAP_READ, pos)
        if len(data) >= _LEN.size:
            want = _LEN.size + _LEN.unpack_from(data, 0)[0]
            if len(data) < want <= self.size - pos:
                data += os.pread(self.fd, want - len(data), pos + len(data))
        return memoryview(data)

    def complete(self, frame: dict[str, Any], start: int, raw: int) -> bool:
        """Read ``frame``'s body, a trajectory's, and give it its outputs (as :func:`read_frames`
        does: False for records that do not unpack, WrongFrame for a wrong field); the ids it
        then holds are views of the shared buffer, good until the next call."""
        global _BODY
        if frame.get("k") != TRAJECTORY:
            return True
        if raw > len(_BODY):
            _BODY = np.empty(max(raw, 2 * len(_BODY)), dtype=np.uint8)
        view = _BODY.data[:raw]
        if os.preadv(self.fd, [view], start) != raw:
            return False
        return _complete(frame, view)


@dataclass
class Skipped:
    """What of a segment the flusher could not turn into rows (docs/ledger.md#unreadable-frames).

    Attributes:
        damaged: trajectory frames whose records do not unpack.
        unknown: frames of a kind this rewardq does not know (a newer one wrote them).
        unreadable_bytes: bytes after the last whole frame that are not a torn last frame: a
            damaged map, and whatever frames followed it (how many cannot be told).
        torn_bytes: a torn last frame (a write cut by a crash of the host): never acknowledged,
            so not counted as lost.
        wrong: frames that parse but have a wrong field (:class:`~rewardq.ledger.checks.WrongFrame`),
            by reason (at most :data:`_REASONS` reasons; the rest are counted under ``other``).
        no_provenance: trajectories written whose provenance blob the segment lacks (their
            ``scoring``, ``scorer``, ... columns are null); not lost, so not in :attr:`frames`.
    """

    damaged: int = 0
    unknown: int = 0
    unreadable_bytes: int = 0
    torn_bytes: int = 0
    wrong: dict[str, int] = field(default_factory=dict)
    no_provenance: int = 0

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Skipped:
        """From the fields a flusher process answered (those this rewardq knows)."""
        return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})

    def count(self, wrong: WrongFrame) -> None:
        """One frame more that parses but has a wrong field."""
        reason = str(wrong)
        if reason not in self.wrong and len(self.wrong) >= _REASONS:
            reason = "other"
        self.wrong[reason] = self.wrong.get(reason, 0) + 1

    @property
    def frames(self) -> int:
        """Frames lost from the ledger: a damaged stretch counts as one (it held one at least)."""
        return self.damaged + self.unknown + sum(self.wrong.values()) + (1 if self.unreadable_bytes else 0)

    def __str__(self) -> str:
        parts = [f"{self.damaged} trajectory frame(s) whose records do not decode"] if self.damaged else []
        if self.unknown:
            parts.append(f"{self.unknown} frame(s) of a kind this rewardq does not know")
        if self.wrong:
            reasons = "; ".join(f"{n} x {reason}" for reason, n in self.wrong.items())
            parts.append(f"{sum(self.wrong.values())} frame(s) with a wrong field ({reasons})")
        if self.unreadable_bytes:
            parts.append(f"{self.unreadable_bytes:,} unreadable bytes after the last whole frame")
        if self.no_provenance:
            parts.append(
                f"{self.no_provenance} trajectory frame(s) naming a provenance blob the segment lacks "
                "(written, their provenance blob columns null)"
            )
        return ", ".join(parts) or "nothing"


#: Reasons of wrong frames a segment names one by one, at most.
_REASONS = 8


def _cut_short(fd: int, pos: int, size: int) -> bool:
    """Whether the bytes of a segment from ``pos`` (where no whole frame starts) to its end are one
    frame cut short, as a torn last write leaves it, rather than damage: its map cut short (what
    is there ends inside one msgpack object), or its whole map naming more bytes than follow it.
    Read only where reading a segment stopped early (once per segment at most)."""
    left = size - pos
    if left < _LEN.size:
        return True
    (n,) = _LEN.unpack(os.pread(fd, _LEN.size, pos))
    if _LEN.size + n <= left:
        try:
            frame = msgpack.unpackb(os.pread(fd, n, pos + _LEN.size), raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException):
            return False
        raw = frame.get("raw") if isinstance(frame, dict) else None
        return isinstance(raw, int) and pos + _LEN.size + n + raw > size
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=64 << 20)
    at = pos + _LEN.size
    while at < size:
        chunk = os.pread(fd, min(1 << 20, size - at), at)
        if not chunk:
            break
        at += len(chunk)
        try:
            unpacker.feed(chunk)
            unpacker.unpack()
        except msgpack.OutOfData:
            continue
        except (ValueError, TypeError, msgpack.UnpackException):
            return False
        return False  # a whole object before the end: the length before it is damaged
    return True


#: The buffer a segment's frame bodies are read into, one after the other (kept by the process).
_BODY = np.empty(1 << 20, dtype=np.uint8)
