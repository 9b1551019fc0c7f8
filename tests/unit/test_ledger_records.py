"""A trajectory spooled as the records the worker read gives exactly the rows of one spooled decoded."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pytest

from rewardq.ledger.frames import TrajectoryFacts, outcome_frame, read_frames, trajectory_frame, trajectory_parts
from rewardq.ledger.results import ERROR_COLUMNS, RESULT_COLUMNS
from rewardq.ledger.sink import error_row
from rewardq.ledger.table import tables_from_frames
from rewardq.queue.codec import EXT_INT64, OutputRecord, decode_output, encode_output
from rewardq.queue.results import RESULT_FIELDS, RewardResult, encode_results

GSM8K = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"}, "extra_info": {"i": 1}}


def _outputs(n: int, *, mask: bool) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        r = np.arange(5 + i, dtype=np.int32) + 3
        o: dict[str, Any] = {"prompt_ids": np.arange(4, dtype=np.int32) + 7, "response_ids": r, "num_turns": i + 1}
        if mask:
            o["response_mask"] = (np.arange(r.shape[0]) % 3 != 0).astype(np.uint8)
        if i == 0:
            o["extra_fields"] = {"tool": "calc", "turns": [1, 2.5, None]}
            o["reward_score"] = 0.25
        out.append(o)
    return out


def _facts(payloads: list[bytes], *, with_payloads: bool, scored_at: float = 1.8e9) -> TrajectoryFacts:
    recs = [decode_output(p) for p in payloads]
    sample = next((r.sample for r in reversed(recs) if r.sample), {})
    res = [RewardResult(r.key, "ok", 1.0, {"acc": 1.0}, worker="w", scored_at=scored_at) for r in recs]
    enc = encode_results(res, 1 << 20)
    return TrajectoryFacts(
        recs,
        sample,
        RESULT_FIELDS,
        enc.rows,
        1,
        scored_at - 1,
        2.0,
        "p" * 16,
        "text",
        [[len(recs) - 1, "d" * 16, '{"a":1}']],
        payloads=payloads if with_payloads else None,
    )


def _payloads(n: int, *, mask: bool, samples: list[dict[str, Any] | None]) -> list[bytes]:
    return [encode_output("u_1", "s", i, o, samples[i], final=i == n - 1) for i, o in enumerate(_outputs(n, mask=mask))]


def _table(facts: TrajectoryFacts) -> pa.Table:
    frames = read_frames(trajectory_frame(1, facts) + outcome_frame(1, True))
    [table] = tables_from_frames(frames).values()
    return table


def _int64_record(index: int, final: bool) -> bytes:
    """A record as a raw ``XADD`` may send it: int64 ids and an int32 mask (the decoder accepts both)."""
    ids = np.arange(6, dtype="<i8") + 3
    data: bytes = msgpack.packb(
        {
            "v": 1,
            "uid": "u_1",
            "session_id": "s",
            "index": index,
            "final": final,
            "prompt_ids": msgpack.ExtType(EXT_INT64, ids.tobytes()),
            "response_ids": msgpack.ExtType(EXT_INT64, ids.tobytes()),
            "response_mask": msgpack.ExtType(1, np.array([1, 0, 1, 1, 0, 1], "<i4").tobytes()),
            "reward_score": 3,
            "sample": {"data_source": "x", "blob": b"\x00\xff", "n": [1, {"k": None}]},
        },
        use_bin_type=True,
    )
    return data


@pytest.mark.parametrize(
    "payloads",
    [
        _payloads(3, mask=True, samples=[GSM8K, GSM8K, GSM8K]),
        _payloads(1, mask=False, samples=[GSM8K]),
        _payloads(3, mask=False, samples=[GSM8K, None, None]),  # the sample on the first output only
        _payloads(2, mask=True, samples=[None, None]),  # no sample at all
        [_int64_record(0, False), _int64_record(1, True)],
        [
            p if i != 1 else _payloads(3, mask=False, samples=[GSM8K] * 3)[1]
            for i, p in enumerate(_payloads(3, mask=True, samples=[GSM8K] * 3))
        ],
    ],
    ids=["masks", "one-output", "sample-first-only", "no-sample", "int64-ids", "one-output-without-mask"],
)
def test_records_spooled_as_read_give_the_same_rows_as_decoded_ones(payloads: list[bytes]) -> None:
    raw, decoded = _facts(payloads, with_payloads=True), _facts(payloads, with_payloads=False)
    assert len(trajectory_parts(1, raw)) == 1 + len(payloads)  # the map, then the records as they are
    assert b"".join(bytes(p) for p in trajectory_parts(1, raw)[1:]) == b"".join(payloads)
    a, b = _table(raw), _table(decoded)
    assert a.num_rows == len(payloads)
    assert a.equals(b), (a.to_pylist(), b.to_pylist())
    masks = [decode_output(p).response_mask for p in payloads]
    want = [None if m is None else m.astype("u1").tobytes() for m in masks]
    assert b.column("response_mask").to_pylist() == want


def test_a_trajectory_whose_sample_is_not_one_of_its_records_is_spooled_decoded() -> None:
    payloads = _payloads(2, mask=True, samples=[GSM8K, GSM8K])
    facts = replace(_facts(payloads, with_payloads=True), sample=dict(GSM8K))  # equal, not the record's own
    parts = trajectory_parts(1, facts)
    assert b"".join(bytes(p) for p in parts[1:]) != b"".join(payloads)
    assert _table(facts).equals(_table(_facts(payloads, with_payloads=False)))


def test_a_damaged_record_drops_its_frame_only() -> None:
    payloads = _payloads(2, mask=True, samples=[GSM8K, GSM8K])
    first = bytearray(trajectory_frame(1, _facts(payloads, with_payloads=True)))
    first[-len(payloads[-1]) :] = b"\xc1" * len(payloads[-1])  # 0xc1: never valid msgpack
    second = trajectory_frame(2, _facts(_payloads(1, mask=False, samples=[GSM8K]), with_payloads=True))
    assert [f["tk"] for f in read_frames(bytes(first) + second)] == [2]


def test_a_record_with_images_is_spooled_decoded() -> None:
    rec = OutputRecord("u", "s", 0, True, np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int32))
    rec.multi_modal_data = {"images": []}
    enc = encode_results([RewardResult(rec.key, "ok", 1.0, {}, worker="w", scored_at=1.8e9)], 1 << 20)
    facts = TrajectoryFacts([rec], {}, RESULT_FIELDS, enc.rows, 1, 1.0, 1.0, "p" * 16, payloads=[b"x" * 50])
    assert b"x" * 50 not in b"".join(bytes(p) for p in trajectory_parts(1, facts))


def test_an_error_row_the_sink_writes_fills_every_result_column() -> None:
    # Given an error row as the ledger sink writes it for a failed trajectory of two outputs
    recs = [decode_output(p) for p in _payloads(2, mask=False, samples=[GSM8K, GSM8K])]
    row = error_row("bad input", failure_kind="input", worker="w1", manager="naive", scored_at=1.8e9, latency_ms=12.5)
    facts = TrajectoryFacts(recs, GSM8K, ERROR_COLUMNS, [row], 1, 1.8e9 - 1, None, "p" * 16)
    # When the flusher makes it a table
    got = _table(facts).select(list(RESULT_COLUMNS)).to_pylist()
    # Then each output's row holds the error in every result column, and the frame's provenance
    want = {
        "status": "error",
        "reward_score": None,
        "reward_extra_info": '{"error": "bad input"}',
        "error": "bad input",
        "failure_kind": "input",
        "worker": "w1",
        "manager": "naive",
        "latency_ms": 12.5,
        "provenance": "p" * 16,
    }
    assert [{c: v for c, v in r.items() if c != "scored_at"} for r in got] == [want, want]
    assert all(r["scored_at"] is not None for r in got)
    assert set(want) | {"scored_at"} == set(RESULT_COLUMNS)  # a column added to the table is checked here too
