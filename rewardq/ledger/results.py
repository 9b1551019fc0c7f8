"""The result columns of ledger rows: a trajectory frame's result rows, decoded a column at a time.

A frame holds its results exactly as the commit encodes them: field names (``rf``) and rows of
bytes (``r``), one per output or one every output shares. :class:`ResultColumns` takes each
frame's rows apart into one list of raw values per column of :data:`RESULT_COLUMNS` (a few list
extends per trajectory, no value decoded) and decodes a partition's values when its table is
made: each distinct value once (status, worker, manager, provenance and most extra info repeat
from row to row), and ``scored_at``, different in every row, by Arrow's kernels in one go. That
was the largest Python cost per trajectory left in the flusher (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rewardq.ledger.checks import WrongFrame, got

if TYPE_CHECKING:
    import pyarrow as pa

#: The columns each result row fills.
RESULT_COLUMNS = (
    "status",
    "reward_score",
    "reward_extra_info",
    "error",
    "failure_kind",
    "worker",
    "manager",
    "scored_at",
    "latency_ms",
    "provenance",
)
#: The columns of an error row the ledger sink writes itself (:meth:`~rewardq.ledger.sink.Ledger.failed`):
#: every result column but ``provenance``, which the trajectory's frame carries once.
ERROR_COLUMNS = tuple(c for c in RESULT_COLUMNS if c != "provenance")


def text(v: object) -> str | None:
    """A result value as text (None when empty)."""
    if v is None or v == b"" or v == "":
        return None
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


def _number(v: object) -> float | None:
    t = text(v)
    try:
        return None if t is None else float(t)
    except ValueError:
        return None


#: The unix seconds a time column holds: those of the years 1 to 9999 (what a UTC date and hour,
#: the ledger's partitions, can name). A time outside them (or NaN, or infinite) is written null.
FIRST_SECOND, END_SECOND = -62_135_596_800.0, 253_402_300_800.0


def micros(seconds: float | None) -> int | None:
    """Unix seconds as integer microseconds (None for none, 0, or a time outside :data:`FIRST_SECOND`
    to :data:`END_SECOND`)."""
    if not seconds or not FIRST_SECOND <= seconds < END_SECOND:
        return None
    return int(round(seconds * 1_000_000))


def _status(v: object) -> str:
    return text(v) or "error"


def scored_at(v: object) -> int | None:
    """A result's ``scored_at`` value as microseconds."""
    return micros(_number(v))


_DECODE = {
    "status": _status,
    "reward_score": _number,
    "reward_extra_info": text,
    "error": text,
    "failure_kind": text,
    "worker": text,
    "manager": text,
    "scored_at": scored_at,
    "latency_ms": _number,
    "provenance": text,
}
SCORED_AT = RESULT_COLUMNS.index("scored_at")
_PROVENANCE = RESULT_COLUMNS.index("provenance")


class ResultColumns:
    """Takes frames' result rows apart by column and decodes them (see the module doc); the
    distinct values decoded are remembered for the whole segment."""

    def __init__(self) -> None:
        self._at: dict[tuple[object, ...], list[int]] = {}
        self._seen: list[dict[Any, Any]] = [{} for _ in RESULT_COLUMNS]
        self._decode = [_DECODE[c] for c in RESULT_COLUMNS]

    def split(self, t: Mapping[str, Any], n: int) -> tuple[list[Sequence[Any]], int]:
        """Frame ``t``'s result rows as raw values by column of :data:`RESULT_COLUMNS` (one row per
        output, or one every output shares: a frame whose row count is not its output count gives
        its first to every output; a row without a provenance digest takes the frame's), and the
        first ``scored_at`` of its rows that is set, in microseconds (0: none)."""
        names = t.get("rf")
        if type(names) is not list:
            raise WrongFrame("trajectory", "rf", f"is not a list of result field names {got(names)}")
        key = tuple(names)
        try:
            at = self._at.get(key)
        except TypeError:  # a name that is a list or a map
            at = None
        if at is None:  # names not seen yet in this segment: checked once
            at = self._at[key] = self._columns(names)
        rows = t.get("r")
        if type(rows) is not list or not rows:
            raise WrongFrame("trajectory", "r", f"is not a list of result rows {got(rows)}")
        if len(rows) != n:
            rows = rows[:1]
        width = len(names)
        by_field: Sequence[Sequence[Any]]
        if all(type(row) is list and len(row) == width for row in rows):
            by_field = list(zip(*rows))
        elif not all(type(row) is list for row in rows):
            raise WrongFrame("trajectory", "r", "holds a result row that is not a list")
        else:
            by_field = [[row[i] if i < len(row) else None for row in rows] for i in range(width)]
        none = [None] * len(rows)
        columns = [by_field[i] if i >= 0 else none for i in at]
        pv = text(t.get("pv"))
        own = columns[_PROVENANCE]
        if pv is not None and (None in own or b"" in own or "" in own):
            columns[_PROVENANCE] = [pv if text(v) is None else v for v in own]
        first = 0
        for v in columns[SCORED_AT]:
            first = scored_at(v) or 0
            if first:
                break
        return columns, first

    @staticmethod
    def _columns(names: list[object]) -> list[int]:
        """Where each of :data:`RESULT_COLUMNS` is in result rows of field names ``names`` (-1: not)."""
        if not all(type(name) is str for name in names):
            raise WrongFrame("trajectory", "rf", "holds a result field name that is not a string")
        index = {name: i for i, name in enumerate(names)}
        return [index.get(c, -1) for c in RESULT_COLUMNS]

    def array(self, column: int, values: list[Any], type_: pa.DataType) -> pa.Array:
        """Column ``column``'s raw ``values`` decoded, as an Arrow array of ``type_``."""
        import pyarrow as pa

        if column == SCORED_AT:
            bulk = _scored_at_array(values)
            if bulk is not None:
                return bulk.cast(type_)
            return pa.array(list(map(scored_at, values)), type=type_)
        seen, decode = self._seen[column], self._decode[column]
        try:
            for v in dict.fromkeys(values):
                if v not in seen:
                    seen[v] = decode(v)
            decoded = list(map(seen.__getitem__, values))
        except TypeError:  # a value that is a list or a map (no hash): its text, as any other value's
            decoded = list(map(decode, values))
        return pa.array(decoded, type=type_)


def _scored_at_array(values: list[Any]) -> pa.Array | None:
    """``scored_at`` values (bytes of decimal unix seconds) as int64 microseconds, as
    :func:`scored_at` gives them, by Arrow in one go; None when any value is not plain UTF-8
    decimal text (the caller then decodes them one by one)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        raw = pa.array(values, type=pa.binary())
        empty = pc.equal(pc.binary_length(raw), 0)
        seconds = pc.if_else(empty, pa.scalar(None, pa.string()), raw.cast(pa.string())).cast(pa.float64())
        us = pc.round(pc.multiply(seconds, 1_000_000.0), ndigits=0, round_mode="half_to_even").cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError):
        return None
    kept = pc.and_(
        pc.not_equal(seconds, 0.0), pc.and_(pc.greater_equal(seconds, FIRST_SECOND), pc.less(seconds, END_SECOND))
    )
    return pc.if_else(kept, us, pa.scalar(None, pa.int64()))
