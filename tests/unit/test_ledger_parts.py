"""The ledger's parts without a worker: frames, the spool, rows, the store, reading back."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from rewardq.errors import ConfigError
from rewardq.ledger.frames import outcome_frame, read_frames, trajectory_frame
from rewardq.ledger.read import latest_rows, parse_where, read_table
from rewardq.ledger.results import SCORED_AT, ResultColumns, scored_at
from rewardq.ledger.schema import COLUMN_NAMES, arrow_schema
from rewardq.ledger.spool import Spool, part_name
from rewardq.ledger.table import partition_of, sample_of, split_sample, tables_from_frames
from tests.support.ledger_facts import SAMPLE, facts, make_ledger, open_spools


@pytest.mark.parametrize(
    "sample",
    [
        SAMPLE,
        {"data_source": "x"},
        {"reward_model": {"style": "rule"}, "raw_prompt": [{"role": "user", "content": "hi"}]},
        {"data_source": 7, "reward_model": {"ground_truth": None}, "extra_info": None, "blob": b"\x00\xff"},
        {"reward_model": "not a dict", "extra_info": {"nested": {"a": [1, 2.5, None, True]}}},
    ],
)
def test_a_sample_is_rebuilt_exactly_from_its_columns(sample: dict[str, Any]) -> None:
    assert sample_of(*split_sample(sample)) == sample


@pytest.mark.parametrize(
    "values",
    [
        [b"1796599149.766982", b"1796599149.766990", b"", None, b"0", b"-0.0", b"1e-7", b"0.0000025", b"+3", b".5"],
        [b"1796599149.5", b" 12.5"],  # whitespace: Arrow refuses it, Python's float takes it
        [b"12.5", b"\xff", "12.25"],  # not UTF-8, and text among bytes
        [b"12.5", b"abc", b"1_0"],
        [b"1796599149.5", b"nan", b"inf", b"-inf", b"1e300", b"5e12", b"-1e12", b"253402300799.5"],  # no UTC hour
        [b"1796599149.5", b"5e12", b"-62135596800"],  # past year 9999 but an int64 of microseconds; year 1
    ],
)
def test_scored_at_decoded_in_bulk_is_what_each_value_decodes_to(values: list[Any]) -> None:
    got = ResultColumns().array(SCORED_AT, values, pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
    assert got == [scored_at(v) for v in values]
    # a time null or in the years 1 to 9999, which the ledger's date and hour partitions can name
    assert all(us is None or partition_of(us / 1e6) for us in got)


def test_frames_read_back_and_a_torn_tail_is_skipped() -> None:
    data = trajectory_frame(1, facts("a")) + outcome_frame(1, True) + trajectory_frame(2, facts("b"))
    assert [f["k"] for f in read_frames(data)] == ["t", "c", "t"]
    assert [f["k"] for f in read_frames(data[:-5])] == ["t", "c"]  # the last frame cut short: dropped
    assert [f["u"] for f in read_frames(data) if f["k"] == "t"] == ["a", "b"]


def test_rows_split_by_the_hour_they_were_scored_in() -> None:
    frames = list(read_frames(trajectory_frame(1, facts("a", scored_at=1.8e9)) + outcome_frame(1, True)))
    frames += list(read_frames(trajectory_frame(2, facts("b", scored_at=1.8e9 + 3600))))
    tables = tables_from_frames(frames)
    assert len(tables) == 2 and all(t.schema.equals(arrow_schema()) for t in tables.values())
    first, second = tables.values()
    assert first["key"].to_pylist() == ["a_s_0", "a_s_1"] and first["committed"].to_pylist() == [True, True]
    assert second["committed"].to_pylist() == [None, None]  # no outcome frame: unknown
    assert first["response"].to_pylist() == [None, "text"]
    assert np.frombuffer(first["response_ids"][1].as_py(), "<i4").tolist() == [0, 1, 2, 3, 4]


def test_a_failed_write_is_cut_back_and_the_next_frames_stay_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path, "w", segment_bytes=1 << 20, segment_seconds=60, settle_seconds=1)
    spool.open()
    spool.append(spool.ticket(), trajectory_frame(1, facts("a")))
    real = os.writev
    calls = {"n": 0}

    def half_then_enospc(fd: int, buffers: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real(fd, [bytes(buffers[0])[:10]])  # a partial write ...
        raise OSError(errno.ENOSPC, "No space left on device")  # ... then the disk is full

    monkeypatch.setattr(os, "writev", half_then_enospc)
    with pytest.raises(OSError):
        spool.append(spool.ticket(), trajectory_frame(2, facts("b")))
    monkeypatch.setattr(os, "writev", real)
    spool.append(spool.ticket(), trajectory_frame(3, facts("c")))
    spool.seal()
    paths = spool.ready(all_=True)
    frames = [f for p in paths for f in read_frames(p.read_bytes())]
    assert [f["u"] for f in frames] == ["a", "c"]  # b was never written, c after it is intact


def test_a_commit_outcome_goes_out_with_the_next_frame_or_the_next_tick(tmp_path: Path) -> None:
    # Given a spool with one trajectory settled (its commit wrote the result)
    spool = Spool(tmp_path, "w", segment_bytes=1 << 20, segment_seconds=60, settle_seconds=1)
    spool.open()
    first = spool.ticket()
    spool.append(first, trajectory_frame(first, facts("a")))
    spool.settle(first, True)
    [segment] = tmp_path.glob("*.wal")

    def kinds() -> list[str]:
        return [f["k"] for f in read_frames(segment.read_bytes())]

    # Then its outcome is not written on its own, but with the next trajectory's frame
    assert kinds() == ["t"]
    second = spool.ticket()
    spool.append(second, trajectory_frame(second, facts("b")))
    assert kinds() == ["t", "c", "t"]
    # And an outcome with no frame after it is written by the ledger's tick
    spool.settle(second, False)
    spool.write_outcomes()
    assert kinds() == ["t", "c", "t", "c"]
    assert [f.get("c") for f in read_frames(segment.read_bytes()) if f["k"] == "c"] == [True, False]
    spool.close()


def test_a_dead_workers_segments_are_adopted_a_live_ones_are_not(tmp_path: Path) -> None:
    alive, dead, me = open_spools(tmp_path, "alive", "dead", "me", writing=("alive", "dead"))
    dead.close()  # its lock is released as by a killed process; its segment stays
    orphans = list(me.orphans())
    assert [o.owner for o in orphans] == ["dead"] and len(orphans[0].segments) == 1
    orphans[0].release(remove=True)
    assert not (tmp_path / "dead.lock").exists()
    # A worker restarted under the name of a dead one takes its leftovers first; its own segments
    # carry a spool id of their own, so no name (nor the Parquet file named after it) is used twice
    again = Spool(tmp_path, "dead", segment_bytes=1 << 20, segment_seconds=60, settle_seconds=1)
    again.open()
    assert [p.name for p in again.leftovers()] == [f"dead.{dead.spool_id}-0000000001.wal"]
    again.append(again.ticket(), trajectory_frame(1, facts("x")))
    assert again.spool_id != dead.spool_id and (tmp_path / f"dead.{again.spool_id}-0000000001.wal").exists()
    assert part_name(tmp_path / f"dead.{again.spool_id}-0000000001.wal") == f"part-dead-{again.spool_id}-0000000001"
    # Two live processes under one name: the second gets a name of its own
    twin = Spool(tmp_path, "alive", segment_bytes=1 << 20, segment_seconds=60, settle_seconds=1)
    twin.open()
    assert twin.owner.startswith("alive-") and twin.owner != "alive"


def test_a_full_disk_costs_the_ledger_its_rows_and_says_so_never_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = make_ledger(tmp_path)
    assert led.scored(facts("a"), {}) is not None
    monkeypatch.setattr(os, "writev", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "disk full")))
    assert led.scored(facts("b"), {}) is None  # no exception: the worker commits all the same
    snap = led.snapshot()
    assert snap["unwritten"] == 1 and snap["state"] == "failing" and "disk full" in snap["last_error"]
    monkeypatch.undo()
    asyncio.run(led.close(10))
    assert read_table(str(tmp_path / "ledger"))["key"].to_pylist() == ["a_s_0", "a_s_1"]


def test_past_spool_max_bytes_trajectories_are_counted_not_spooled(tmp_path: Path) -> None:
    led = make_ledger(tmp_path, spool_max_bytes=1)
    assert led.scored(facts("a"), {}) is not None
    assert led.scored(facts("b"), {}) is None
    assert led.snapshot()["unwritten"] == 1 and "ledger_spool_max_bytes" in led.last_error
    asyncio.run(led.close(10))


def test_an_in_memory_fsspec_ledger_is_written_and_read(tmp_path: Path) -> None:
    url = f"memory://rewardq-test-{os.getpid()}/ledger"
    led = make_ledger(tmp_path, url)
    for i in range(3):
        led.settle(led.scored(facts(f"t{i}"), {"scorer": "default:gsm8k"}), True)
    asyncio.run(led.close(10))
    table = read_table(url)
    assert table.num_rows == 6 and table["scorer"].to_pylist() == ["default:gsm8k"] * 6
    assert read_table(url, where=parse_where(["key=t1_s_1"]))["key"].to_pylist() == ["t1_s_1"]
    with pytest.raises(ConfigError, match="attempt=first: not a number, and column attempt holds int32"):
        read_table(url, where=parse_where(["attempt=first"]))  # a bad flag, not a traceback
    assert read_table(url, since=1.8e9 + 1).num_rows == 0 and read_table(url, until=1.8e9 + 1).num_rows == 6


def test_a_destination_that_refuses_files_keeps_the_segments_and_retries(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the ledger's folder should be")
    led = make_ledger(tmp_path, str(blocker / "ledger"))
    led.settle(led.scored(facts("a"), {}), True)
    asyncio.run(led.flush_due(everything=True))
    snap = led.snapshot()
    assert snap["state"] == "failing" and snap["pending_segments"] == 1 and "cannot write" in snap["last_error"]
    assert list((tmp_path / "spool").glob("*.wal"))
    blocker.unlink()  # the destination is back
    asyncio.run(led.close(10))
    assert read_table(str(blocker / "ledger")).num_rows == 2 and not list((tmp_path / "spool").glob("*.wal"))


def _rows(*items: tuple[str, int, bool | None, float]) -> pa.Table:
    keys, attempts, committed, scored = zip(*items)
    ts = pa.array([int(s * 1e6) for s in scored], type=pa.timestamp("us", tz="UTC"))
    return pa.table({"key": list(keys), "attempt": list(attempts), "committed": list(committed), "scored_at": ts})


def test_one_row_per_key_committed_false_loses_then_highest_attempt() -> None:
    table = _rows(
        ("a", 1, None, 1.0),  # killed before its commit ...
        ("a", 2, True, 2.0),  # ... scored again: this one stands
        ("b", 1, True, 1.0),  # committed first ...
        ("b", 2, False, 2.0),  # ... a later attempt found it done: not what the trainer got
        ("c", 1, None, 5.0),
        ("c", 1, None, 6.0),  # the same attempt twice: the latest
    )
    kept = latest_rows(table).to_pylist()
    assert [(r["key"], r["attempt"], r["committed"]) for r in kept] == [("a", 2, True), ("b", 1, True), ("c", 1, None)]
    assert kept[2]["scored_at"].timestamp() == 6.0


def test_filters_apply_to_each_keys_kept_row_not_to_a_superseded_one(tmp_path: Path) -> None:
    # Given trajectory a scored 0.0 by an attempt whose commit lost, then 1.0 by the next attempt
    led = make_ledger(tmp_path)
    led.settle(led.scored(facts("a", score=0.0, attempt=1), {}), False)
    led.settle(led.scored(facts("a", score=1.0, attempt=2, scored_at=1.8e9 + 100), {}), True)
    led.settle(led.scored(facts("b", score=0.0), {}), True)
    asyncio.run(led.close(10))
    url = str(tmp_path / "ledger")
    # Then a filter matches what each key's kept row says, never the superseded row
    zero = read_table(url, where=parse_where(["reward_score=0.0"]))
    assert zero["key"].to_pylist() == ["b_s_0", "b_s_1"]
    assert read_table(url, until=1.8e9 + 50)["key"].to_pylist() == ["b_s_0", "b_s_1"]
    late = read_table(url, since=1.8e9 + 50, columns=["key", "attempt", "reward_score"]).to_pylist()
    assert late == [{"key": f"a_s_{i}", "attempt": 2, "reward_score": 1.0} for i in range(2)]
    # and without dedup every row is there to filter, as written
    assert read_table(url, where=parse_where(["reward_score=0.0"]), dedup=False).num_rows == 4
    # A time range reads the hour folders near it only, also for the rows of its keys: a file two
    # days away that is not even Parquet is never opened
    far = tmp_path / "ledger" / "date=2020-01-01" / "hour=0"
    far.mkdir(parents=True)
    (far / "part-x.parquet").write_bytes(b"not parquet")
    assert read_table(url, since=1.8e9 + 50)["key"].to_pylist() == ["a_s_0", "a_s_1"]
    assert read_table(url, where=parse_where(["status=ok"]), since=1.8e9 - 3600)["key"].to_pylist() == [
        "a_s_0",
        "a_s_1",
        "b_s_0",
        "b_s_1",
    ]


def test_where_names_columns_and_says_how() -> None:
    assert parse_where(["data_source=a", "data_source=b", "status=ok"]) == {"data_source": ["a", "b"], "status": ["ok"]}
    with pytest.raises(Exception, match="no column 'nope'"):
        parse_where(["nope=1"])
    with pytest.raises(Exception, match="COLUMN=VALUE"):
        parse_where(["data_source"])
    assert "key" in COLUMN_NAMES
