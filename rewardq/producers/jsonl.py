"""The JSONL file format for recorded rollouts: one trajectory per line.

Used by ``rewardq produce`` (push a file) and ``rewardq demo --write-jsonl``. A line is::

    {"uid": "3f2c…", "session_id": "1",
     "sample": {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"}, ...},
     "outputs": [{"prompt_ids": [...], "response_ids": [...], "response_mask": [...],
                  "response_logprobs": [...], "num_turns": 3, "extra_fields": {...}}, ...],
     "expected": 1.0}

Token ids are JSON lists of ints: a format people open in an editor, not the wire format
(that is msgpack with packed arrays, see :mod:`rewardq.queue.codec`). ``expected`` (the
reward the line must get) is optional.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rewardq.errors import JsonlLineError, RecordError
from rewardq.queue.codec import encode_output

__all__ = ["LINE_KEYS", "JsonlLineError", "parse_line", "read_jsonl", "write_jsonl"]


#: Keys a JSONL line may hold; ``uid``, ``session_id`` and ``outputs`` are required.
LINE_KEYS = ("uid", "session_id", "sample", "outputs", "expected")


def _to_jsonable(value: object) -> object:
    if hasattr(value, "tolist"):  # numpy arrays, torch tensors
        return value.tolist()
    raise TypeError(f"cannot write a {type(value).__name__} to JSONL")


def write_jsonl(path: str | Path, trajectories: Iterable[dict[str, object]], *, with_expected: bool = True) -> int:
    """Write one trajectory per line; returns the number of lines. Arrays become int lists."""
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for t in trajectories:
            line = {k: t[k] for k in LINE_KEYS if k in t and (with_expected or k != "expected")}
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=_to_jsonable) + "\n")
            count += 1
    return count


def parse_line(text: str, line: int) -> dict[str, object]:
    """Parse and fully validate one JSONL line; raises :class:`JsonlLineError` naming the field.

    Every output is checked exactly as the producer will encode it (token ids are
    non-negative ints, ``response_mask`` matches ``response_ids`` and holds only 0/1, ...),
    so a line that parses here is a line the queue accepts.
    """
    try:
        d = json.loads(text)
    except ValueError as exc:
        raise JsonlLineError(line, "<json>", f"not valid JSON ({exc})") from None
    if not isinstance(d, dict):
        raise JsonlLineError(line, "<json>", f"expected a JSON object, got {type(d).__name__}")
    unknown = sorted(set(d) - set(LINE_KEYS))
    if unknown:
        raise JsonlLineError(line, unknown[0], f"unknown key(s) {unknown}; a line holds {', '.join(LINE_KEYS)}")
    for key in ("uid", "session_id", "outputs"):
        if key not in d:
            raise JsonlLineError(line, key, "is missing")
    outputs, sample = d["outputs"], d.get("sample") or {}
    if not isinstance(outputs, list) or not outputs:
        raise JsonlLineError(line, "outputs", "must be a non-empty list of output objects")
    if not isinstance(sample, dict):
        raise JsonlLineError(line, "sample", f"must be an object, got {type(sample).__name__}")
    expected = d.get("expected")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, (int, float))):
        raise JsonlLineError(line, "expected", f"must be a number, got {type(expected).__name__}")
    for i, out in enumerate(outputs):
        if not isinstance(out, dict):
            raise JsonlLineError(line, f"outputs[{i}]", f"must be an object, got {type(out).__name__}")
        try:
            encode_output(d["uid"], d["session_id"], i, out, sample, final=i == len(outputs) - 1)
        except RecordError as exc:
            where = exc.field if exc.field in ("uid", "session_id", "sample") else f"outputs[{i}].{exc.field}"
            raise JsonlLineError(line, where, exc.detail) from None
    return {
        "uid": str(d["uid"]),
        "session_id": str(d["session_id"]),
        "sample": sample,
        "outputs": outputs,
        **({"expected": float(expected)} if expected is not None else {}),
    }


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | JsonlLineError]]:
    """Yield ``(line_number, trajectory)`` or ``(line_number, JsonlLineError)``; blank lines are skipped."""
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                yield number, parse_line(text, number)
            except JsonlLineError as exc:
                yield number, exc
