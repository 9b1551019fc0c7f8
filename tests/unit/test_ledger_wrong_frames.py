"""A spooled frame that parses but has a field missing or wrong costs its segment nothing else: it
is counted as unreadable with its reason (the field named), the segment's other trajectories are
written exactly as without it, and the segment is kept aside, not retried. A destination or disk
that fails is still a flush error, retried."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rewardq.ledger import flusher
from rewardq.ledger.frames import Skipped, outcome_frame, trajectory_parts
from rewardq.ledger.store import LedgerFile, LedgerStore
from rewardq.queue.codec import EXT_INT32
from tests.support.ledger_facts import facts, make_ledger, read_facts
from tests.support.ledger_frames import (
    BLOB,
    DEEP,
    Made,
    as_is,
    drop_field,
    framed,
    good,
    ledger_rows,
    set_field,
    spooled,
    wrong,
)

WRONG = {
    # the trajectory frame's own fields
    "no-result-fields": (
        wrong(drop_field("rf")),
        "trajectory field 'rf' is not a list of result field names (missing)",
    ),
    "result-fields-not-names": (wrong(set_field("rf", [1, 2])), "trajectory field 'rf' holds a result field name that"),
    "result-rows-a-number": (wrong(set_field("r", 7)), "trajectory field 'r' is not a list of result rows (got int)"),
    "result-row-text": (wrong(set_field("r", ["ok"])), "trajectory field 'r' holds a result row that is not a list"),
    "no-ticket": (wrong(drop_field("tk")), "trajectory field 'tk' is not a ticket number (missing)"),
    "uid-a-number": (wrong(set_field("u", 7)), "trajectory field 'u' is not a string (got int)"),
    "attempt-past-int32": (wrong(set_field("a", 2**40)), "trajectory field 'a' is not an attempt number (got int)"),
    "put-time-text": (wrong(set_field("ts", "yesterday")), "trajectory field 'ts' is not a number (got str)"),
    "score-ms-text": (wrong(set_field("sm", "2")), "trajectory field 'sm' is not a number (got str)"),
    "response-bytes": (wrong(set_field("txt", b"72")), "trajectory field 'txt' is not a string (got bytes)"),
    "judge-not-indexed": (wrong(set_field("j", [["x", "d", "a"]])), "trajectory field 'j' holds a judge request"),
    "records-a-number": (
        wrong(set_field("rec", 7)),
        "trajectory field 'rec' is not a list of record lengths (got int)",
    ),
    "records-too-short": (wrong(lambda d: d["rec"].pop()), "trajectory field 'rec' names fewer bytes than the frame's"),
    "sample-record-text": (wrong(set_field("si", "1")), "trajectory field 'si' is not a record number (got str)"),
    "no-raw": (lambda t: framed({"k": "t", "tk": t, "u": "x", "sid": "s", "rf": [], "r": []}), "field 'raw' (missing)"),
    # a record's fields (the frame spooled as the records the worker read)
    "ids-a-list": (wrong(record=set_field("prompt_ids", [1, 2, 3])), "record field 'prompt_ids' is not a packed array"),
    "ids-half-an-int": (
        wrong(record=set_field("response_ids", msgpack.ExtType(EXT_INT32, b"\x01\x00"))),
        "record field 'response_ids' is not a packed array of whole integers",
    ),
    "index-text": (wrong(record=set_field("index", "1")), "record field 'index' is not an output index (got str)"),
    "no-final": (wrong(record=drop_field("final")), "record field 'final' is not true or false (missing)"),
    "turns-negative": (wrong(record=set_field("num_turns", -1)), "record field 'num_turns' is not a count (got int)"),
    "sample-a-list": (wrong(record=set_field("sample", [1, 2])), "record field 'sample' is not a map (got list)"),
    "extra-too-deep": (
        wrong(record=set_field("extra_fields", {"deep": DEEP})),
        "output field 'extra_fields' holds a value JSON cannot hold",
    ),
    # a failure's frame (spooled decoded)
    "output-short": (wrong(lambda d: d["o"][0].pop(), decoded=True), "trajectory field 'o' holds an output that"),
    "ids-length-odd": (
        wrong(lambda d: d["o"][0].__setitem__(2, 3), decoded=True),
        "trajectory output field 'prompt_ids' is not a length of whole int32 ids",
    ),
    "ids-not-the-body": (
        wrong(lambda d: d["o"][0].__setitem__(3, d["o"][0][3] + 4), decoded=True),
        "trajectory field 'raw' is not the length of its outputs' ids",
    ),
    "sample-text": (wrong(set_field("s", "gsm8k"), decoded=True), "trajectory field 's' is not a map (got str)"),
    # commit outcomes and provenance blobs
    "outcome-ticket-text": (lambda _: outcome_frame("1", True), "commit outcome field 'tk' is not a ticket number"),  # type: ignore[arg-type]
    "outcome-not-a-flag": (lambda _: framed({"k": "c", "tk": 1, "c": "yes"}), "commit outcome field 'c' is not true"),
    "outcome-of-nothing": (lambda _: outcome_frame(999, True), "commit outcome field 'tk' names no trajectory of its"),
    "blob-no-digest": (lambda _: framed({"k": "p", "b": BLOB}), "provenance field 'd' is not a digest (missing)"),
    "blob-a-list": (lambda _: framed({"k": "p", "d": "e" * 16, "b": [1]}), "provenance field 'b' is not a map"),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_a_wrong_frame_is_counted_with_its_field_and_the_others_are_written_as_without_it(
    tmp_path: Path, case: str
) -> None:
    made, reason = WRONG[case]
    a, b = good()
    # Given a segment with trajectories a and b, and between them one wrong frame
    segment = spooled(tmp_path / "spool", [a, made, b])
    # When the flusher writes it
    written = flusher.write_segment(LedgerStore(str(tmp_path / "ledger")), segment)
    # Then the wrong frame is counted, with a reason naming its field
    assert written is not None
    [(counted, n)] = written.skipped.wrong.items()
    assert reason in counted and n == 1 and written.skipped.frames == 1
    assert reason in str(written.skipped)
    # And a and b are written exactly as from a segment without it
    clean = spooled(tmp_path / "clean", [a, b])
    flusher.write_segment(LedgerStore(str(tmp_path / "want")), clean)
    got, want = ledger_rows(tmp_path / "ledger"), ledger_rows(tmp_path / "want")
    assert written.rows == want.num_rows == 5 and got.equals(want)
    assert got["key"].to_pylist() == ["a_s_0", "a_s_1", "b_s_0", "b_s_1", "b_s_2"]
    assert got["committed"].to_pylist() == [True] * 5 and got["scorer"].to_pylist() == ["default:gsm8k"] * 5
    # And the segment is kept aside for an operator, never handed to a flusher again
    assert written.kept == f"{segment}.unreadable" and not segment.exists()


def test_wrong_frames_are_counted_by_reason_and_logged_once_and_the_segment_is_not_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a dead worker's segment: trajectories a and b, two frames whose ids are lists, and an outcome of nothing
    spool = tmp_path / "spool"
    ids_a_list = WRONG["ids-a-list"][0]
    a, b = good()
    spooled(spool, [a, ids_a_list, b, ids_a_list, WRONG["outcome-of-nothing"][0]]).rename(spool / "dead.0000000001.wal")
    led = make_ledger(tmp_path)
    # When the worker's ledger writes what is due, twice
    with caplog.at_level(logging.WARNING, logger="rewardq.ledger"):
        asyncio.run(led.flush_due(everything=True))
        first = led.snapshot()
        asyncio.run(led.flush_due(everything=True))
    # Then a and b are in the ledger, the three wrong frames counted once, and nothing is an error
    assert ledger_rows(tmp_path / "ledger")["key"].to_pylist() == ["a_s_0", "a_s_1", "b_s_0", "b_s_1", "b_s_2"]
    snap = led.snapshot()
    assert (snap["rows"], snap["unreadable"], snap["adopted"], snap["errors"], snap["state"]) == (5, 3, 1, 0, "ok")
    assert snap == first  # the second pass found nothing to write again
    # And one warning names the segment, each reason with its count, and where the segment is kept
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "dead.0000000001.wal" in warning and "3 frame(s) with a wrong field" in warning
    assert "2 x record field 'prompt_ids' is not a packed array (got list)" in warning
    assert "1 x commit outcome field 'tk' names no trajectory of its segment" in warning
    assert sorted(p.name for p in spool.glob("dead.*")) == ["dead.0000000001.wal.unreadable"]
    asyncio.run(led.close(10))


def test_a_destination_that_fails_is_a_flush_error_retried_even_beside_a_wrong_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a segment with a wrong frame, and a destination whose disk is full
    a, b = good()
    segment = spooled(tmp_path / "spool", [a, WRONG["ids-a-list"][0], b])
    store = LedgerStore(str(tmp_path / "ledger"))
    real = LedgerFile.write

    def disk_full(self: LedgerFile, table: pa.Table) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(LedgerFile, "write", disk_full)
    # When the flusher writes it, it is a flush error: the segment stays as it is, for a retry
    with pytest.raises(flusher.FlushError, match="No space left on device"):
        flusher.write_segment(store, segment)
    assert segment.exists() and not list(tmp_path.rglob("*.parquet"))
    # And so is a disk that fails reading the segment back
    monkeypatch.setattr(LedgerFile, "write", real)
    monkeypatch.setattr(os, "pread", lambda *_: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error")))
    with pytest.raises(flusher.FlushError, match="Input/output error"):
        flusher.write_segment(store, segment)
    assert segment.exists()
    # And once the destination works, the retry writes it and counts the wrong frame
    monkeypatch.undo()
    written = flusher.write_segment(store, segment)
    assert written is not None and written.rows == 5 and sum(written.skipped.wrong.values()) == 1


def test_values_a_column_cannot_hold_are_written_null_not_refused(tmp_path: Path) -> None:
    # Given trajectories whose result times are not times a row can hold, one ended unscored (attempt 0)
    rows = []
    for uid, when in (("nan", b"nan"), ("inf", b"inf"), ("far", b"1e300"), ("year-160000", b"5e12"), ("text", b"x")):
        t = facts(uid)
        at = list(t.result_fields).index("scored_at")
        t.result_rows = [[when if i == at else v for i, v in enumerate(row)] for row in t.result_rows]
        rows.append(t)
    expired = facts("expired")
    expired.attempt = 0
    mapped = facts("mapped")  # and one whose extra info is a map, not the text of one
    info = list(mapped.result_fields).index("reward_extra_info")
    as_map: object = {"acc": 1}
    mapped.result_rows = [[as_map if i == info else v for i, v in enumerate(row)] for row in mapped.result_rows]  # type: ignore[misc]
    segment = spooled(tmp_path / "spool", [*rows, expired, mapped])
    # When the flusher writes them
    written = flusher.write_segment(LedgerStore(str(tmp_path / "ledger")), segment)
    # Then every row is written, those times null (in the partition of no time), the attempt kept
    assert written is not None and written.rows == 14 and written.skipped == Skipped()
    table = ledger_rows(tmp_path / "ledger")
    by_key = {r["key"]: r for r in table.to_pylist()}
    assert [by_key[f"{u}_s_0"]["scored_at"] for u in ("nan", "inf", "far", "year-160000", "text")] == [None] * 5
    assert by_key["expired_s_1"]["attempt"] == 0 and by_key["nan_s_1"]["attempt"] == 1
    assert by_key["mapped_s_0"]["reward_extra_info"] == "{'acc': 1}"  # its text, as any value's


def test_a_trajectory_whose_provenance_blob_is_missing_is_written_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a trajectory whose blob the segment lacks (its provenance frame was never written)
    lost = read_facts("lost")
    lost.provenance = "9" * 16

    segment = spooled(tmp_path / "spool", [read_facts("a"), as_is(lost)])
    # When the flusher writes it
    written = flusher.write_segment(LedgerStore(str(tmp_path / "ledger")), segment)
    # Then its rows are written with the digest and no blob columns, and that is said, nothing lost
    assert written is not None and written.rows == 4 and written.skipped == Skipped(no_provenance=1)
    assert written.skipped.frames == 0 and written.kept is None and not segment.exists()
    assert "1 trajectory frame(s) naming a provenance blob the segment lacks" in str(written.skipped)
    rows = {r["key"]: r for r in ledger_rows(tmp_path / "ledger").to_pylist()}
    assert rows["lost_s_0"]["provenance"] == "9" * 16 and rows["lost_s_0"]["scorer"] is None
    assert rows["a_s_0"]["scorer"] == "default:gsm8k"


def test_a_frame_after_a_blob_that_json_cannot_hold_keeps_its_rows(tmp_path: Path) -> None:
    # a provenance blob too deep for JSON is a wrong frame; the trajectory naming it keeps its rows
    deep = read_facts("deep")
    deep.provenance = "d" * 16

    def blob_too_deep(ticket: int) -> bytes:
        return framed({"k": "p", "d": "d" * 16, "b": {"scorer": DEEP}})

    segment = spooled(tmp_path / "spool", [blob_too_deep, as_is(deep)])
    written = flusher.write_segment(LedgerStore(str(tmp_path / "ledger")), segment)
    assert written is not None and written.rows == 2 and written.skipped.no_provenance == 1
    assert list(written.skipped.wrong) == ["provenance field 'b' holds a value JSON cannot hold"]


#: Values put in place of each field by the test below: every type msgpack reads, and numbers past a column's range.
ODD = [None, True, -1, 2**40, 2**63, 1.5, float("nan"), "x", b"x", [], [1], {}, {"a": [1]}, msgpack.ExtType(5, b"ab")]


DROP = object()  # in place of a value: the field removed


def _change(name: str, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda d: d.pop(name, None) if value is DROP else d.__setitem__(name, value)


def _change_output(at: int, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda d: d["o"][0].__setitem__(at, value)


def test_no_value_in_any_field_fails_the_segment_or_changes_the_other_rows(tmp_path: Path) -> None:
    # Given one segment of trajectories a and b, and between them a frame for each field of a
    # trajectory frame (both forms), of its outputs and of its records, with each odd value there
    made: list[Made] = []

    def odd() -> list[object]:  # text made the frame's own: a frame written under uid "x" is told apart
        return [f"x{len(made)}" if v == "x" else v for v in ODD]

    for decoded in (False, True):
        head = msgpack.unpackb(bytes(trajectory_parts(1, facts("x") if decoded else read_facts("x"))[0])[4:])
        for name in sorted(set(head) - {"raw"}):  # a frame's ``raw`` is its length: framing, not a field
            for value in [*odd(), DROP]:
                made.append(wrong(_change(name, value), decoded=decoded, uid=f"m{len(made)}"))
        for at in range(8):
            for value in ODD:
                made.append(wrong(_change_output(at, value), decoded=True, uid=f"m{len(made)}"))
    record = msgpack.unpackb(read_facts("x").payloads[-1])  # type: ignore[index]
    for name in sorted(record):
        for value in [*ODD, DROP]:
            made.append(wrong(record=_change(name, value), uid=f"m{len(made)}"))
    a, b = good()
    segment = spooled(tmp_path / "spool", [a, *made, b])
    # When the flusher writes it, it raises nothing
    written = flusher.write_segment(LedgerStore(str(tmp_path / "ledger")), segment)
    assert written is not None
    # Then each odd frame is either written or counted, never both, and a and b are as without them
    rows = ledger_rows(tmp_path / "ledger")
    uids = set(rows["uid"].to_pylist())
    assert written.skipped.frames + len(uids - {"a", "b"}) == len(made)
    clean = spooled(tmp_path / "clean", [a, b])
    flusher.write_segment(LedgerStore(str(tmp_path / "want")), clean)
    mine = pc.is_in(rows["uid"], pa.array(["a", "b"]))
    assert rows.filter(mine).equals(ledger_rows(tmp_path / "want"))
    assert written.skipped.unknown == 2 * (len(ODD) + 1)  # every odd kind ``k``, in both forms


def test_replay_and_report_take_rows_without_a_time_and_ids_that_are_not_int32s(tmp_path: Path) -> None:
    from rewardq.ledger import replay, report

    # Given a ledger with trajectory a, t whose results' time did not read as one (null scored_at),
    # and u whose ids were cut (a ledger not written by rewardq's flusher)
    untimed = facts("t")
    at = list(untimed.result_fields).index("scored_at")
    untimed.result_rows = [[b"nan" if i == at else v for i, v in enumerate(row)] for row in untimed.result_rows]
    ledger = tmp_path / "ledger"
    flusher.write_segment(LedgerStore(str(ledger)), spooled(tmp_path / "spool", [read_facts("a"), untimed]))
    cut = ledger_rows(ledger).slice(0, 2).to_pylist()
    for row in cut:
        row["uid"], row["key"], row["prompt_ids"] = "u", row["key"].replace("a_", "u_"), b"\x01\x00\x00"
    pq.write_table(
        pa.Table.from_pylist(cut, schema=ledger_rows(ledger).schema), ledger / "date=2027-01-15" / "cut.parquet"
    )
    # When a replay plans it, it plans a and t (t, with no time, first), and counts u as unreadable
    plan = replay.plan(str(ledger))
    assert [t.uid for t in plan.trajectories] == ["t", "a"] and plan.unreadable == 1
    # And the report counts t (every trajectory is) but puts it on no time axis, and draws the others
    rows = report.load(str(ledger), None, None, None)
    assert rows.n == 3 and int(np.isnan(rows.t).sum()) == 1
    assert "1 without a result time" in report.render(str(ledger), rows)


def test_a_worker_reads_a_flusher_answer_with_fields_it_does_not_know() -> None:
    # a flusher process of a newer rewardq (started after an upgrade in place) may say more
    answer = {"damaged": 1, "wrong": {"record field 'index' is not an output index (got str)": 2}, "newer": 3}
    got = Skipped.of(answer)
    assert got == Skipped(damaged=1, wrong={"record field 'index' is not an output index (got str)": 2})
    assert got.frames == 3


def test_an_answer_the_worker_cannot_read_is_a_flush_error_and_the_ledgers_loop_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rewardq.ledger import sink

    # Given a flusher process whose stdout something else wrote to (no process is started here)
    monkeypatch.setattr(flusher.ProcessFlusher, "_start", lambda self: None)
    monkeypatch.setattr(flusher.ProcessFlusher, "_ask", lambda self, path: b"Loading weights...\n")
    answers = flusher.ProcessFlusher("/nowhere")
    # Then what it answered is a flush error (the segment stays, retried), not an exception of another kind
    with pytest.raises(flusher.FlushError, match="answered what this worker cannot read"):
        answers.write(tmp_path / "w.0000000001.wal")
    # And a ledger whose flush raises anything at all counts it and goes on flushing
    led = make_ledger(tmp_path)
    calls = []

    async def failing(*, everything: bool = False) -> None:
        calls.append(everything)
        raise RuntimeError("a bug")

    monkeypatch.setattr(led, "flush_due", failing)
    monkeypatch.setattr(sink, "_TICK", 0.01)

    async def run_a_while() -> bool:
        task = asyncio.create_task(led.run())
        while len(calls) < 3:
            await asyncio.sleep(0.01)
        alive = not task.done()
        task.cancel()
        return alive

    assert asyncio.run(run_a_while())
    assert led.counts["errors"] >= 3 and "RuntimeError: a bug" in led.last_error
    asyncio.run(led.close(1))
