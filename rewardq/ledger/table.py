"""From spool frames to ledger rows: Arrow tables by hour of ``scored_at``.

:class:`SegmentRows` takes the trajectory frames of one segment (:mod:`rewardq.ledger.frames`) one
by one and groups their rows by the UTC hour they were scored in; each group gives a
:class:`pyarrow.Table` with exactly :func:`~rewardq.ledger.schema.arrow_schema`'s columns when
asked, as often as asked (the flusher asks every row group's worth of ids, and its tables reuse
the same buffers, :mod:`rewardq.ledger.columns`). :func:`tables_from_frames` gives a segment's
rows as one table per hour. The sample is split into the documented columns and its rest kept as
JSON, so a replay rebuilds it exactly (:func:`sample_of`).

Columns are built a partition at a time, not a row at a time: Python touches each trajectory
once (its sample, its outputs' extra fields; its result rows are taken apart by column and decoded
a partition at a time, :mod:`rewardq.ledger.results`) and each output's values go to Arrow as one
list per column; what is the same for every output of a trajectory (its
sample, uid, attempt, result when shared, ...) is kept once and repeated by Arrow (``take``),
and the keys and the final output's response are made by Arrow's kernels. That is the
flusher's Python cost per trajectory (docs/performance.md).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rewardq.ledger.bodies import EXTRA, FINAL, INDEX, MASK, PROMPT, RESPONSE, ROLLOUT, TURNS
from rewardq.ledger.checks import WrongFrame, check_outcome, check_provenance, check_trajectory
from rewardq.ledger.columns import BinaryColumn, Buffers
from rewardq.ledger.frames import OUTCOME, PROVENANCE, TRAJECTORY
from rewardq.ledger.results import RESULT_COLUMNS, ResultColumns, micros, text
from rewardq.ledger.schema import SCHEMA_VERSION, arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa

#: A partition: the UTC date (``YYYY-MM-DD``) and hour of ``scored_at``.
Partition = tuple[str, int]
_BYTES_TAG = "__bytes__"
#: Provenance blob keys copied to columns of the same name.
_BLOB_COLUMNS = ("scoring", "rewardq_version", "scorer", "judge_model", "judge_template", "judge_sampling", "isolation")


def to_json(value: object) -> str:
    """Compact JSON of a sample value; bytes become ``{"__bytes__": base64}``, keys text."""
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError):
        return _ENCODER.encode(_text_keys(value))


def _json_default(value: object) -> object:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES_TAG: base64.b64encode(bytes(value)).decode()}
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else str(value)


#: One encoder for every value (``json.dumps`` with options builds a new one per call).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_json_default)


def _text_keys(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _text_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_text_keys(v) for v in value]
    return value


def from_json(text: str | None) -> Any:
    """The value :func:`to_json` wrote (bytes restored)."""
    if text is None:
        return None
    return json.loads(text, object_hook=_bytes_hook)


def _bytes_hook(d: dict[str, Any]) -> object:
    if len(d) == 1 and _BYTES_TAG in d and isinstance(d[_BYTES_TAG], str):
        return base64.b64decode(d[_BYTES_TAG])
    return d


def split_sample(sample: Mapping[str, object]) -> tuple[str | None, str | None, str | None, str]:
    """``(data_source, ground_truth JSON, extra_info JSON, rest JSON)`` of a sample (see :func:`sample_of`)."""
    rest = dict(sample)
    ds = rest.pop("data_source", None)
    if ds is not None and not isinstance(ds, str):
        rest["data_source"], ds = ds, None  # kept as it was; the column holds text only
    gt: str | None = None
    rm = rest.get("reward_model")
    if isinstance(rm, Mapping) and "ground_truth" in rm:
        gt = to_json(rm["ground_truth"])
        others = {k: v for k, v in rm.items() if k != "ground_truth"}
        if others:
            rest["reward_model"] = others
        else:
            del rest["reward_model"]
    extra = to_json(rest.pop("extra_info")) if "extra_info" in rest else None
    return ds, gt, extra, to_json(rest)


def sample_of(
    data_source: str | None, ground_truth: str | None, extra_info: str | None, rest: str | None
) -> dict[str, Any]:
    """The sample :func:`split_sample` split, rebuilt exactly."""
    sample: dict[str, Any] = from_json(rest) or {}
    if data_source is not None:
        sample["data_source"] = data_source
    if ground_truth is not None:
        rm = sample.get("reward_model")
        sample["reward_model"] = {**(rm if isinstance(rm, dict) else {}), "ground_truth": from_json(ground_truth)}
    if extra_info is not None:
        sample["extra_info"] = from_json(extra_info)
    return sample


def partition_of(seconds: float) -> Partition:
    """The UTC date and hour ``seconds`` (unix time) falls in."""
    t = dt.datetime.fromtimestamp(seconds or 0.0, tz=dt.timezone.utc)
    return t.strftime("%Y-%m-%d"), t.hour


#: Columns with one value per trajectory: kept once per trajectory, repeated per output by Arrow.
_TRAJECTORY_COLUMNS = (
    "schema_version",
    "uid",
    "session_id",
    "outputs",
    "data_source",
    "ground_truth",
    "extra_info",
    "sample",
    "attempt",
    "committed",
    "put_at",
    "score_ms",
    *_BLOB_COLUMNS,
)


#: Why a frame whose sample, extra fields or provenance blob cannot be written as JSON is wrong
#: (nesting deeper than the encoder recurses, or a map key of no type JSON has).
_NO_JSON = "holds a value JSON cannot hold"
_JSON_ERRORS = (ValueError, TypeError, RecursionError)


class _Rows:
    """The rows of one partition, taken frame by frame: what is the same for every output of a
    trajectory once, each output's values in one list per column, the ids in one buffer per column
    (see the module doc and :class:`~rewardq.ledger.columns.BinaryColumn`)."""

    def __init__(self, buffers: Buffers | None = None) -> None:
        self.ids = {at: BinaryColumn(at, buffers) for at in (PROMPT, RESPONSE, MASK)}
        self.reset()

    def reset(self) -> None:
        """Empty, the tables made so far no longer used (the ids' buffers are kept: :class:`BinaryColumn`)."""
        for ids in self.ids.values():
            ids.reset()
        self.per_trajectory: dict[str, list[Any]] = {name: [] for name in _TRAJECTORY_COLUMNS}
        self.tickets: list[int] = []  # each trajectory's, for its ``committed`` (its outcome may come later)
        self.provenance: list[str] = []  # each trajectory's blob digest, for the blob columns
        self.outputs: list[int] = []
        self.prefix: list[str] = []  # ``<uid>_<session_id>_`` of each trajectory
        self.text: list[str | None] = []
        self.judged: list[tuple[int, Any, list[Any]]] = []  # (first row, frame's judge entries, its indexes)
        self.results: list[list[Any]] = [[] for _ in RESULT_COLUMNS]  # raw values, by column
        self.result_of: list[int] = []  # per output: its row in ``results``
        self.per_output: list[list[Any]] = [[] for _ in range(ROLLOUT + 1)]  # by field, ids excepted

    @property
    def id_bytes(self) -> int:
        """Bytes of ids taken since the last table."""
        return sum(ids.pos for ids in self.ids.values())

    def add(self, t: Mapping[str, Any], results: list[Sequence[Any]]) -> None:
        """One trajectory frame, checked (:func:`~rewardq.ledger.checks.check_trajectory`), ``results``
        its result rows by column (:meth:`ResultColumns.split`). What can fail on the frame's values
        (its sample's and extra fields' JSON) comes before anything is taken: a WrongFrame leaves
        the rows as they were."""
        outputs = t["o"]
        n = len(outputs)
        uid, sid = t["u"], t["sid"]
        by_field = list(zip(*outputs))
        try:
            ds, gt, extra, rest = split_sample(t.get("s") or {})
        except _JSON_ERRORS:
            raise WrongFrame("trajectory", "s", _NO_JSON) from None
        try:
            extras = [to_json(e) if e else "{}" for e in by_field[EXTRA]]
        except _JSON_ERRORS:
            raise WrongFrame("output", "extra_fields", _NO_JSON) from None
        attempt, score_ms = t.get("a"), t.get("sm")
        values = (SCHEMA_VERSION, uid, sid, n, ds, gt, extra, rest, 1 if attempt is None else attempt, None)
        score_ms = None if score_ms is None else float(score_ms)  # an int past 2**53: Arrow takes no such double
        for column, value in zip(self.per_trajectory.values(), (*values, micros(t.get("ts")), score_ms)):
            column.append(value)
        self.tickets.append(t["tk"])
        self.provenance.append(t.get("pv") or "")
        if t.get("j"):
            self.judged.append((len(self.per_output[INDEX]), t["j"], list(by_field[INDEX])))
        self.outputs.append(n)
        self.prefix.append(f"{uid}_{sid}_")
        self.text.append(t.get("txt"))
        base, rows = len(self.results[0]), len(results[0])
        for into, got in zip(self.results, results):
            into.extend(got)
        self.result_of.extend(range(base, base + n) if rows == n else [base] * n)
        runs = t.get("ids")  # each column's ids in one run (the decoded form, rewardq.ledger.frames)
        for at, column in enumerate(self.per_output):
            if at == EXTRA:
                column.extend(extras)
            elif at not in self.ids:
                column.extend(by_field[at])
            elif runs is not None:
                data, lengths = runs[at - PROMPT]
                self.ids[at].extend_run(data, lengths, none_is_empty=at != MASK)
            else:
                ids = by_field[at]
                self.ids[at].extend(ids if at == MASK else [b"" if v is None else v for v in ids])

    def table(
        self, outcomes: Mapping[int, bool | None], blobs: Mapping[str, Mapping[str, Any]], decode: ResultColumns
    ) -> pa.Table:
        import pyarrow as pa
        import pyarrow.compute as pc

        schema = arrow_schema()
        types = {f.name: f.type for f in schema}
        per = self.per_trajectory
        per["committed"] = [outcomes.get(t) for t in self.tickets]
        by_digest = {pv: [_blob_text(blobs.get(pv, {}).get(k)) for k in _BLOB_COLUMNS] for pv in set(self.provenance)}
        for name, values in zip(_BLOB_COLUMNS, zip(*[by_digest[pv] for pv in self.provenance])):
            per[name] = list(values)
        repeat = pa.array(np.repeat(np.arange(len(self.outputs), dtype=np.int32), self.outputs))
        cols: dict[str, Any] = {name: pa.array(values, type=types[name]).take(repeat) for name, values in per.items()}
        result_of = pa.array(self.result_of, type=pa.int32())
        for c, (name, raw) in enumerate(zip(RESULT_COLUMNS, self.results)):
            cols[name] = decode.array(c, raw, types[name]).take(result_of)
        fields = self.per_output
        index = cols["index"] = pa.array(fields[INDEX], type=pa.int32())
        final = cols["final"] = pa.array(fields[FINAL], type=pa.bool_())
        for name, at in (("prompt", PROMPT), ("response", RESPONSE)):
            cols[f"{name}_ids"] = self.ids[at].array()
            cols[f"{name}_length"] = pc.divide(self.ids[at].counts(), 4)
        cols["response_mask"] = self.ids[MASK].array()
        cols["num_turns"] = pa.array(fields[TURNS], type=pa.int32())
        cols["extra_fields"] = pa.array(fields[EXTRA], type=pa.string())
        cols["rollout_reward_score"] = pa.array(fields[ROLLOUT], type=pa.float64())
        prefix = pa.array(self.prefix, type=pa.string()).take(repeat)
        cols["key"] = pc.binary_join_element_wise(prefix, pc.cast(index, pa.string()), "")
        text = pa.array(self.text, type=pa.string()).take(repeat)
        cols["response"] = pc.if_else(final, text, pa.scalar(None, pa.string()))
        cols["judge_request"], cols["judge_answer"] = self._judges(len(fields[INDEX]))
        return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)

    def _judges(self, total: int) -> tuple[pa.Array, pa.Array]:
        """``judge_request`` and ``judge_answer``: per output the judge request of its index, else
        the trajectory's last one (null without a judge)."""
        import pyarrow as pa

        requests: list[str | None] = [None] * total
        answers: list[str | None] = [None] * total
        for first, entries, indexes in self.judged:
            judged = {int(j[0]): j for j in entries if len(j) >= 3}
            if not judged:
                continue
            last_judged = judged[max(judged)]
            for k, i in enumerate(indexes):
                j = judged.get(int(i), last_judged)
                requests[first + k], answers[first + k] = text(j[1]), text(j[2])
        return pa.array(requests, type=pa.string()), pa.array(answers, type=pa.string())


class SegmentRows:
    """The rows of one segment's trajectory frames, by partition (see the module doc).

    Args:
        outcomes: each ticket's commit outcome (``committed``), looked up when a table is made.
        blobs: the provenance blobs by digest, looked up when a table is made.
        buffers: where the ids are copied, kept from table to table (:class:`Buffers`): a table
            made with them is good until the next :meth:`add`; None: tables are kept.
    """

    def __init__(
        self,
        outcomes: Mapping[int, bool | None],
        blobs: Mapping[str, Mapping[str, Any]],
        buffers: Buffers | None = None,
    ) -> None:
        self.outcomes, self.blobs, self.buffers = outcomes, blobs, buffers
        self.parts: dict[Partition, _Rows] = {}
        self._hours: dict[int, Partition] = {}
        self._results = ResultColumns()

    def add(self, t: Mapping[str, Any]) -> Partition:
        """One trajectory frame, taken as it comes (it need not be kept); returns its partition.
        Raises :class:`~rewardq.ledger.checks.WrongFrame`, having taken nothing of it, for a
        frame with a wrong field."""
        check_trajectory(t)
        results, scored = self._results.split(t, len(t["o"]))
        hour = scored // 3_600_000_000
        key = self._hours.get(hour)
        if key is None:
            key = self._hours[hour] = partition_of(scored / 1_000_000)
        part = self.parts.get(key)
        if part is None:
            part = self.parts[key] = _Rows(self.buffers)
        part.add(t, results)
        return key

    def id_bytes(self, key: Partition) -> int:
        """Bytes of ids partition ``key`` holds since its last table."""
        return self.parts[key].id_bytes

    def take(self, key: Partition) -> pa.Table | None:
        """Partition ``key``'s rows since its last table, as a table (None: no rows)."""
        part = self.parts[key]
        if not part.outputs:
            return None
        table = part.table(self.outcomes, self.blobs, self._results)
        part.reset()
        return table


def is_trajectory(
    frame: Mapping[str, Any], outcomes: dict[int, bool | None], blobs: dict[str, Mapping[str, Any]]
) -> bool | None:
    """Whether ``frame`` is a trajectory's; a commit outcome or a provenance blob goes to
    ``outcomes`` or ``blobs`` instead (False), or raises :class:`~rewardq.ledger.checks.WrongFrame`
    when a field of it is wrong; None for a frame of a kind not known here (a newer rewardq wrote
    it), which the flusher counts as unreadable."""
    kind = frame.get("k")
    if kind == TRAJECTORY:
        return True
    if kind == OUTCOME:
        ticket, committed = frame.get("tk"), frame.get("c")
        if type(ticket) is int and (committed is None or type(committed) is bool):
            outcomes[ticket] = committed
        else:
            check_outcome(frame)  # raises, naming the field
    elif kind == PROVENANCE:
        digest, blob = check_provenance(frame)
        try:  # as the columns named after them hold them
            blobs[digest] = {name: _blob_text(blob.get(name)) for name in _BLOB_COLUMNS}
        except _JSON_ERRORS:
            raise WrongFrame("provenance", "b", _NO_JSON) from None
    else:
        return None
    return False


def tables_from_frames(frames: Iterable[Mapping[str, Any]]) -> dict[Partition, pa.Table]:
    """The rows of a segment's frames, as one table per partition (see the module doc), frames
    with a wrong field left out. Each trajectory frame is taken as it comes, so the frames need
    not be held all at once."""
    blobs: dict[str, Mapping[str, Any]] = {}
    outcomes: dict[int, bool | None] = {}
    rows = SegmentRows(outcomes, blobs)
    for t in frames:
        try:
            if is_trajectory(t, outcomes, blobs):
                rows.add(t)
        except WrongFrame:
            continue
    tables = {p: rows.take(p) for p in sorted(rows.parts)}
    return {p: t for p, t in tables.items() if t is not None}


def _blob_text(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else to_json(v)
