"""The ledger's flusher process: Parquet written beside the worker, and a flusher that dies or is
interrupted never loses a spooled trajectory."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rewardq.ledger.flusher import ProcessFlusher, Written
from rewardq.ledger.frames import outcome_frame
from rewardq.ledger.read import read_table
from rewardq.ledger.sink import Ledger
from tests.support.ledger_facts import damaged_segment, facts, make_ledger
from tests.support.ledger_frames import drop_field, good, ledger_rows, set_field, spooled, wrong


def spool(led: Ledger, *uids: str) -> None:
    for uid in uids:
        led.settle(led.scored(facts(uid), {}), True)


def _with_flusher(tmp_path: Path) -> tuple[Ledger, ProcessFlusher, int]:
    """An open ledger writing through its flusher process, that process, and its pid."""
    led = make_ledger(tmp_path, flusher_process=True)
    flusher = led.flusher
    assert isinstance(flusher, ProcessFlusher) and flusher.pid is not None
    return led, flusher, flusher.pid


def test_a_killed_or_interrupted_flusher_process_loses_no_spooled_trajectory(tmp_path: Path) -> None:
    # Given a ledger writing through its flusher process
    led, flusher, first = _with_flusher(tmp_path)
    url = str(tmp_path / "ledger")
    spool(led, "a")
    asyncio.run(led.flush_due(everything=True))
    assert read_table(url).num_rows == 2 and led.snapshot()["rows"] == 2
    # When a Ctrl-C reaches it (the whole process group gets one), it goes on
    os.kill(first, signal.SIGINT)
    spool(led, "b")
    asyncio.run(led.flush_due(everything=True))
    assert flusher.pid == first and read_table(url).num_rows == 4
    # And when it is killed, the next segment starts another and nothing spooled is missing
    os.kill(first, signal.SIGKILL)
    spool(led, "c")
    asyncio.run(led.close(30))
    keys = sorted(read_table(url)["key"].to_pylist())
    assert keys == [f"{u}_s_{i}" for u in "abc" for i in range(2)]
    assert flusher.pid is None and not list((tmp_path / "spool").glob("*.wal"))
    assert led.snapshot()["rows"] == 6


def test_a_worker_stopping_late_stops_a_stuck_flusher_and_keeps_its_segment(tmp_path: Path) -> None:
    # Given a flusher process that hangs (stopped) while a thread waits for it to write a segment
    led, flusher, pid = _with_flusher(tmp_path)
    os.kill(pid, signal.SIGSTOP)
    spool(led, "a")

    async def stop() -> float:
        # When the worker stops with one second of grace
        t0 = time.monotonic()
        await led.close(1.0)
        return time.monotonic() - t0

    took = asyncio.run(stop())
    # Then it stops in about that time, starts no other flusher, and the segment stays for the next worker
    assert took < 10 and flusher.pid is None
    assert [p.name for p in (tmp_path / "spool").glob("*.wal")] == [f"w1.{led.spool.spool_id}-0000000001.wal"]
    assert not list((tmp_path / "ledger").rglob("*.parquet"))


def test_frames_the_flusher_process_cannot_read_are_counted_logged_and_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a dead worker's segment: trajectories a and b whole, between them one whose records were
    # damaged on disk and a frame of a kind a newer rewardq wrote, and a torn last frame
    led, _, _ = _with_flusher(tmp_path)
    segment = tmp_path / "spool" / "dead.0000000001.wal"
    damaged_segment(segment)
    # When the worker's flusher process writes it
    with caplog.at_level(logging.WARNING, logger="rewardq.ledger"):
        asyncio.run(led.close(30))
    # Then the whole trajectories are in the ledger, and nothing else
    keys = sorted(read_table(str(tmp_path / "ledger"))["key"].to_pylist())
    assert keys == ["a_s_0", "a_s_1", "b_s_0", "b_s_1"]
    # And exactly the damaged and the unknown frame are counted (the torn tail held nothing acknowledged)
    snap = led.snapshot()
    assert (snap["rows"], snap["unreadable"], snap["adopted"], snap["errors"]) == (4, 2, 1, 0)
    # And one warning names the segment and what was skipped, and the segment is kept aside
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(segment) in warnings[0]
    assert "1 trajectory frame(s) whose records do not decode" in warnings[0]
    assert "1 frame(s) of a kind" in warnings[0] and "unreadable bytes" not in warnings[0]
    assert sorted(p.name for p in segment.parent.glob("dead.*")) == ["dead.0000000001.wal.unreadable"]


def test_wrong_frames_cost_the_flusher_process_nothing_else_and_are_not_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a dead worker's segment: trajectories a and b, and beside them frames that parse but are
    # wrong (no result fields, ids that are not a packed array, a commit outcome of no trajectory)
    led, flusher, pid = _with_flusher(tmp_path)
    segment = tmp_path / "spool" / "dead.0000000001.wal"
    a, b = good()
    no_rf, ids_a_list = wrong(drop_field("rf")), wrong(record=set_field("prompt_ids", [1, 2, 3]))
    spooled(tmp_path / "made", [a, no_rf, b, ids_a_list, lambda _: outcome_frame(999, True)]).rename(segment)
    # When the worker's flusher process writes it, and the ledger looks for work again
    with caplog.at_level(logging.WARNING, logger="rewardq.ledger"):
        asyncio.run(led.flush_due(everything=True))
        first = led.snapshot()
        asyncio.run(led.flush_due(everything=True))
    # Then a and b are in the ledger with their values, by the same flusher process (it did not fail)
    rows = ledger_rows(tmp_path / "ledger").to_pylist()
    assert [r["key"] for r in rows] == ["a_s_0", "a_s_1", "b_s_0", "b_s_1", "b_s_2"] and flusher.pid == pid
    assert [r["reward_score"] for r in rows] == [1.0, 1.0, 0.5, 0.5, 0.5]
    assert rows[3]["response_mask"] == bytes([1, 0, 1, 1, 0]) and all(r["committed"] for r in rows)
    # And the three wrong frames are counted once, with no error and nothing left to retry
    snap = led.snapshot()
    assert (snap["rows"], snap["unreadable"], snap["adopted"], snap["errors"], snap["pending_segments"]) == (
        5,
        3,
        1,
        0,
        0,
    )
    assert snap == first
    # And one warning names each field, and the segment is kept aside
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for reason in (
        "1 x trajectory field 'rf' is not a list of result field names (missing)",
        "1 x record field 'prompt_ids' is not a packed array (got list)",
        "1 x commit outcome field 'tk' names no trajectory of its segment",
    ):
        assert reason in warning
    assert sorted(p.name for p in segment.parent.glob("dead.*")) == ["dead.0000000001.wal.unreadable"]
    asyncio.run(led.close(30))


def test_a_flusher_process_that_cannot_be_started_is_a_failing_ledger_retried_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a ledger whose flusher process died, on a machine that cannot start another (EAGAIN)
    led = make_ledger(tmp_path, flusher_process=True, flush_interval=0.1)
    assert isinstance(led.flusher, ProcessFlusher) and led.flusher.pid is not None
    os.kill(led.flusher.pid, signal.SIGKILL)
    real_popen = subprocess.Popen

    def no_fork(*args: object, **kwargs: object) -> object:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess, "Popen", no_fork)
    spool(led, "a")
    led.spool.segment_seconds = 0.0  # its segment is due at the next tick
    # When the background loop comes to write its segment
    asyncio.run(_run_for(led, 2.5))
    # Then the ledger says it is failing, why, and keeps the segment, backing off between tries
    snap = led.snapshot()
    assert snap["state"] == "failing" and "could not be started" in snap["last_error"], snap
    assert snap["errors"] <= 2 and snap["pending_segments"] == 1 and snap["rows"] == 0, snap
    # And once a process can be started again, the segment is written
    monkeypatch.setattr(subprocess, "Popen", real_popen)
    asyncio.run(led.close(30))
    assert read_table(str(tmp_path / "ledger"))["key"].to_pylist() == ["a_s_0", "a_s_1"]


def test_an_adoption_cut_short_by_any_error_leaves_the_dead_workers_segment_adoptable(tmp_path: Path) -> None:
    # Given a dead worker's segment in the spool, and a ledger whose first write of it fails unforeseen
    dead = spooled(tmp_path / "spool", [facts("dead")])
    led = make_ledger(tmp_path)
    flusher = led.flusher
    assert flusher is not None
    write = flusher.write
    calls: list[Path] = []

    def fails_once(path: Path) -> Written | None:
        calls.append(path)
        if len(calls) == 1:
            raise RuntimeError("unforeseen")
        return write(path)

    flusher.write = fails_once  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        asyncio.run(led.flush_due(everything=True))
    # When the ledger adopts again
    asyncio.run(led.flush_due(everything=True))
    # Then the dead worker's lock was let go the first time: its segment is written and gone
    assert calls == [dead, dead] and led.counts["adopted"] == 1 and not dead.exists()
    asyncio.run(led.close(10))
    assert read_table(str(tmp_path / "ledger"))["key"].to_pylist() == ["dead_s_0", "dead_s_1"]


async def _run_for(led: Ledger, seconds: float) -> None:
    """The worker's background loop of ``led`` for ``seconds``, then cancelled."""
    task = asyncio.create_task(led.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
