"""From spool frames to ledger rows: one Arrow table per hour of ``scored_at``.

:func:`tables_from_frames` reads the frames of one segment (:mod:`rewardq.ledger.frames`) and
returns its rows grouped by the UTC hour they were scored in, each group a :class:`pyarrow.Table`
with exactly :func:`~rewardq.ledger.schema.arrow_schema`'s columns. The sample is split into the
documented columns and its rest kept as JSON, so a replay rebuilds it exactly
(:func:`sample_of`).
"""

from __future__ import annotations

import array
import base64
import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rewardq.ledger.frames import OUTCOME, PROVENANCE, TRAJECTORY
from rewardq.ledger.schema import COLUMN_NAMES, SCHEMA_VERSION, arrow_schema

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


def _text(v: object) -> str | None:
    if v is None or v == b"" or v == "":
        return None
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


def _number(v: object) -> float | None:
    text = _text(v)
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _micros(seconds: float | None) -> int | None:
    return None if not seconds else int(round(seconds * 1_000_000))


def partition_of(seconds: float) -> Partition:
    """The UTC date and hour ``seconds`` (unix time) falls in."""
    t = dt.datetime.fromtimestamp(seconds or 0.0, tz=dt.timezone.utc)
    return t.strftime("%Y-%m-%d"), t.hour


#: Columns taken from the spool without a copy where the frame keeps them in one run (see frames),
#: with where each output's entry of a frame holds them.
_ID_COLUMNS = {"prompt_ids": 2, "response_ids": 3, "response_mask": 4}
#: The columns each result row fills, and how its bytes become the column's value.
_RESULT_COLUMNS = (
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


def _status(v: object) -> str:
    return _text(v) or "error"


def _scored_at(v: object) -> int | None:
    return _micros(_number(v))


_RESULT_DECODE = {
    "status": _status,
    "reward_score": _number,
    "reward_extra_info": _text,
    "error": _text,
    "failure_kind": _text,
    "worker": _text,
    "manager": _text,
    "scored_at": _scored_at,
    "latency_ms": _number,
    "provenance": _text,
}
_SCORED_AT = _RESULT_COLUMNS.index("scored_at")
_MISSING = object()


class _Results:
    """Decodes the result rows of a segment's frames column by column; the values that repeat from
    row to row (status, worker, manager, provenance, most extra info) are decoded once."""

    def __init__(self) -> None:
        self._at: dict[tuple[str, ...], list[int]] = {}
        self._seen: list[dict[Any, Any]] = [{} for _ in _RESULT_COLUMNS]

    def columns(self, t: Mapping[str, Any], n: int) -> list[list[Any]]:
        """Each of :data:`_RESULT_COLUMNS` for the ``n`` rows of frame ``t`` (a frame holding one
        result row gives it to every output)."""
        names = tuple(t.get("rf") or ())
        at = self._at.get(names)
        if at is None:
            index = {name: i for i, name in enumerate(names)}
            at = self._at[names] = [index.get(c, -1) for c in _RESULT_COLUMNS]
        rows = t.get("r") or [()]
        if len(rows) != n:
            rows = rows[:1] * n
        out = []
        for c, (i, seen) in enumerate(zip(at, self._seen)):
            raw = [row[i] if 0 <= i < len(row) else None for row in rows]
            if c == _SCORED_AT:  # different in every row: nothing to reuse
                out.append([_scored_at(v) for v in raw])
                continue
            values = []
            for v in raw:
                got = seen.get(v, _MISSING)
                if got is _MISSING:
                    got = seen[v] = _RESULT_DECODE[_RESULT_COLUMNS[c]](v)
                values.append(got)
            out.append(values)
        return out


class _Rows:
    """The rows of one partition: per-output columns as lists, per-trajectory columns once per
    trajectory (with the count of its outputs), id columns as chunks (one per trajectory, taken
    from the spool segment without a copy when the frame holds them in one run)."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {
            name: [] for name in COLUMN_NAMES if name not in _ID_COLUMNS and name not in _TRAJECTORY_COLUMNS
        }
        self.per_trajectory: dict[str, list[Any]] = {name: [] for name in _TRAJECTORY_COLUMNS}
        self.outputs: list[int] = []
        self.chunks: dict[str, list[Any]] = {name: [] for name in _ID_COLUMNS}

    def table(self) -> pa.Table:
        import numpy as np
        import pyarrow as pa

        schema = arrow_schema()
        repeat = pa.array(np.repeat(np.arange(len(self.outputs), dtype=np.int32), self.outputs))
        arrays: list[Any] = []
        for f in schema:
            if f.name in self.chunks:
                arrays.append(pa.chunked_array(self.chunks[f.name], type=f.type))
            elif f.name in self.per_trajectory:
                arrays.append(pa.array(self.per_trajectory[f.name], type=f.type).take(repeat))
            else:
                arrays.append(pa.array(self.cols[f.name], type=f.type))
        return pa.Table.from_arrays(arrays, schema=schema)


def tables_from_frames(frames: Iterable[Mapping[str, Any]]) -> dict[Partition, pa.Table]:
    """The rows of a segment's frames, as one table per partition (see the module doc)."""
    blobs: dict[str, Mapping[str, Any]] = {}
    outcomes: dict[int, bool | None] = {}
    trajectories: list[Mapping[str, Any]] = []
    for f in frames:
        kind = f.get("k")
        if kind == TRAJECTORY:
            trajectories.append(f)
        elif kind == OUTCOME:
            outcomes[int(f["tk"])] = f.get("c")
        elif kind == PROVENANCE:
            blobs[str(f["d"])] = f.get("b") or {}
    parts: dict[Partition, _Rows] = {}
    hours: dict[int, Partition] = {}
    blob_values: dict[str, list[str | None]] = {}
    results = _Results()
    for t in trajectories:
        columns = results.columns(t, len(t["o"]))
        scored = next((v for v in columns[_SCORED_AT] if v), 0)
        hour = scored // 3_600_000_000
        key = hours.get(hour)
        if key is None:
            key = hours[hour] = partition_of(scored / 1_000_000)
        part = parts.get(key)
        if part is None:
            part = parts[key] = _Rows()
        pv = str(t.get("pv") or "")
        values = blob_values.get(pv)
        if values is None:
            blob = blobs.get(pv, {})
            values = blob_values[pv] = [_blob_text(blob.get(k)) for k in _BLOB_COLUMNS]
        add_trajectory(part, t, values, outcomes.get(int(t["tk"])), columns)
    return {p: rows.table() for p, rows in sorted(parts.items())}


def add_trajectory(
    rows: _Rows,
    t: Mapping[str, Any],
    blob_values: list[str | None],
    committed: bool | None,
    results: list[list[Any]],
) -> None:
    """Append the rows of one trajectory frame to ``rows`` (one per output): the values that are
    the same for every output once, ``results`` (:meth:`_Results.columns`) as they are."""
    import pyarrow as pa

    cols = rows.cols
    uid, sid = str(t["u"]), str(t["sid"])
    outputs = t["o"]
    n = len(outputs)
    ds, gt, extra, rest = split_sample(t.get("s") or {})
    per = rows.per_trajectory
    for name, value in zip(
        _TRAJECTORY_COLUMNS,
        (
            SCHEMA_VERSION,
            uid,
            sid,
            n,
            ds,
            gt,
            extra,
            rest,
            int(t.get("a") or 1),
            committed,
            _micros(t.get("ts")),
            t.get("sm"),
            *blob_values,
        ),
    ):
        per[name].append(value)
    rows.outputs.append(n)
    pv = _text(t.get("pv"))
    judged = {int(j[0]): j for j in t.get("j") or () if len(j) >= 3}
    txt = t.get("txt")
    cols["key"].extend([f"{uid}_{sid}_{o[0]}" for o in outputs])
    cols["index"].extend([int(o[0]) for o in outputs])
    cols["final"].extend([bool(o[1]) for o in outputs])
    cols["prompt_length"].extend([len(o[2] or b"") // 4 for o in outputs])
    cols["response_length"].extend([len(o[3] or b"") // 4 for o in outputs])
    cols["num_turns"].extend([o[5] for o in outputs])
    cols["extra_fields"].extend([to_json(o[6]) if o[6] else "{}" for o in outputs])
    cols["rollout_reward_score"].extend([o[7] for o in outputs])
    cols["response"].extend([txt if o[1] else None for o in outputs])
    if judged:
        last_judged = judged[max(judged)]
        judges = [judged.get(int(o[0]), last_judged) for o in outputs]
        cols["judge_request"].extend([_text(j[1]) for j in judges])
        cols["judge_answer"].extend([_text(j[2]) for j in judges])
    else:
        cols["judge_request"].extend([None] * n)
        cols["judge_answer"].extend([None] * n)
    for name, values in zip(_RESULT_COLUMNS, results):
        if name == "provenance" and pv is not None:
            values = [v or pv for v in values]
        cols[name].extend(values)
    for name, i in _ID_COLUMNS.items():
        run = t.get(f"ids:{name}")
        ids = [o[i] if name == "response_mask" else o[i] or b"" for o in outputs]
        if run is not None and all(isinstance(v, memoryview) for v in ids):
            offsets, at = array.array("i", [0]), 0
            for v in ids:
                at += len(v)
                offsets.append(at)
            chunk = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(run)])
        else:  # a frame written before the ids followed it raw (bytes of their own), or some masks missing
            chunk = pa.array([None if v is None else bytes(v) for v in ids], type=pa.binary())
        rows.chunks[name].append(chunk)


def _blob_text(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else to_json(v)
