"""From spool frames to ledger rows: one Arrow table per hour of ``scored_at``.

:func:`tables_from_frames` reads the frames of one segment (:mod:`rewardq.ledger.frames`) and
returns its rows grouped by the UTC hour they were scored in, each group a :class:`pyarrow.Table`
with exactly :func:`~rewardq.ledger.schema.arrow_schema`'s columns. The sample is split into the
documented columns and its rest kept as JSON, so a replay rebuilds it exactly
(:func:`sample_of`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
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
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_default)
    except (TypeError, ValueError):
        return json.dumps(_text_keys(value), ensure_ascii=False, separators=(",", ":"), default=_json_default)


def _json_default(value: object) -> object:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES_TAG: base64.b64encode(bytes(value)).decode()}
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else str(value)


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


def _bytes_hook(d: dict[str, Any]) -> Any:
    if len(d) == 1 and _BYTES_TAG in d and isinstance(d[_BYTES_TAG], str):
        return base64.b64decode(d[_BYTES_TAG])
    return d


def split_sample(sample: Mapping[str, Any]) -> tuple[str | None, str | None, str | None, str]:
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


def _text(v: Any) -> str | None:
    if v is None or v == b"" or v == "":
        return None
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


def _number(v: Any) -> float | None:
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


class _Rows:
    """Column lists of one partition."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {name: [] for name in COLUMN_NAMES}

    def extend(self, cols: Mapping[str, list[Any]]) -> None:
        for name, values in self.cols.items():
            values.extend(cols[name])

    def table(self) -> pa.Table:
        import pyarrow as pa

        schema = arrow_schema()
        arrays = [pa.array(self.cols[f.name], type=f.type) for f in schema]
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
    for t in trajectories:
        cols = trajectory_columns(t, blobs.get(str(t.get("pv") or ""), {}), outcomes.get(int(t["tk"])))
        scored = next((us for us in cols["scored_at"] if us), 0)
        parts.setdefault(partition_of(scored / 1_000_000), _Rows()).extend(cols)
    return {p: rows.table() for p, rows in sorted(parts.items())}


def _result(fields: list[str], row: Sequence[Any]) -> dict[str, Any]:
    """One result row of a frame as column values."""
    r = dict(zip(fields, row))
    return {
        "status": _text(r.get("status")) or "error",
        "reward_score": _number(r.get("reward_score")),
        "reward_extra_info": _text(r.get("reward_extra_info")),
        "error": _text(r.get("error")),
        "failure_kind": _text(r.get("failure_kind")),
        "worker": _text(r.get("worker")),
        "manager": _text(r.get("manager")),
        "scored_at": _micros(_number(r.get("scored_at"))),
        "latency_ms": _number(r.get("latency_ms")),
        "provenance": _text(r.get("provenance")),
    }


def trajectory_columns(t: Mapping[str, Any], blob: Mapping[str, Any], committed: bool | None) -> dict[str, list[Any]]:
    """The rows of one trajectory frame, as one list per column (one item per output)."""
    uid, sid = str(t["u"]), str(t["sid"])
    outputs = t["o"]
    n = len(outputs)
    ds, gt, extra, rest = split_sample(t.get("s") or {})
    fields = list(t.get("rf") or ())
    results = [_result(fields, r) for r in t.get("r") or ()] or [_result(fields, [])]
    per_key = results if len(results) == n else results[:1] * n
    for r in per_key:
        r["provenance"] = r["provenance"] or _text(t.get("pv"))
    judged = {int(j[0]): j for j in t.get("j") or () if len(j) >= 3}
    last_judged = judged[max(judged)] if judged else None
    judges = [judged.get(int(o[0]), last_judged) for o in outputs]
    cols: dict[str, list[Any]] = {
        "schema_version": [SCHEMA_VERSION] * n,
        "key": [f"{uid}_{sid}_{o[0]}" for o in outputs],
        "uid": [uid] * n,
        "session_id": [sid] * n,
        "index": [int(o[0]) for o in outputs],
        "final": [bool(o[1]) for o in outputs],
        "outputs": [n] * n,
        "data_source": [ds] * n,
        "ground_truth": [gt] * n,
        "extra_info": [extra] * n,
        "sample": [rest] * n,
        "prompt_ids": [o[2] or b"" for o in outputs],
        "response_ids": [o[3] or b"" for o in outputs],
        "response_mask": [o[4] for o in outputs],
        "prompt_length": [len(o[2] or b"") // 4 for o in outputs],
        "response_length": [len(o[3] or b"") // 4 for o in outputs],
        "num_turns": [o[5] for o in outputs],
        "extra_fields": [to_json(o[6] or {}) for o in outputs],
        "rollout_reward_score": [o[7] for o in outputs],
        "response": [t.get("txt") if o[1] else None for o in outputs],
        "attempt": [int(t.get("a") or 1)] * n,
        "committed": [committed] * n,
        "put_at": [_micros(t.get("ts"))] * n,
        "score_ms": [t.get("sm")] * n,
        "judge_request": [_text(j[1]) if j else None for j in judges],
        "judge_answer": [_text(j[2]) if j else None for j in judges],
        **{k: [_blob_text(blob.get(k))] * n for k in _BLOB_COLUMNS},
    }
    for name in per_key[0]:
        cols[name] = [r[name] for r in per_key]
    return cols


def _blob_text(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else to_json(v)
