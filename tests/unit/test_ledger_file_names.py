"""Ledger and spool file names: each segment's files are its own, across every life of a worker's
name; a worker's lock file goes with its clean stop, and a lock on a deleted lock file counts for nothing."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rewardq.ledger.flusher import write_segment
from rewardq.ledger.read import read_table
from rewardq.ledger.sink import Ledger
from rewardq.ledger.spool import take_lock
from rewardq.ledger.store import LedgerStore
from tests.support.ledger_facts import facts, make_ledger, open_spools
from tests.support.ledger_frames import spooled


def _run(led: Ledger, *uids: str) -> None:
    """One life of a worker: it spools ``uids`` (same hour: ``facts``' scored_at), then stops cleanly."""
    for uid in uids:
        led.settle(led.scored(facts(uid), {}), True)
    asyncio.run(led.close(10))


def test_a_worker_started_again_under_its_name_keeps_every_earlier_file(tmp_path: Path) -> None:
    # Given a worker w1 that wrote its ledger and stopped cleanly (its spool is empty again)
    _run(make_ledger(tmp_path), "a", "b")
    assert not list((tmp_path / "spool").glob("*.wal"))
    # When w1 is started again and writes rows scored in the same hour
    _run(make_ledger(tmp_path), "c")
    # Then the first run's rows are still there, in a file of their own
    files = sorted((tmp_path / "ledger").rglob("*.parquet"))
    assert len(files) == 2 and len({f.parent for f in files}) == 1
    assert sorted(read_table(str(tmp_path / "ledger"))["key"].to_pylist()) == [
        f"{u}_s_{i}" for u in "abc" for i in range(2)
    ]


def test_workers_of_one_name_on_two_hosts_keep_each_others_files(tmp_path: Path) -> None:
    # Given two workers named w1 on two hosts (a spool each) writing one ledger in the same hour
    settings = dict(flush_interval=60.0, file_bytes=1 << 20, spool_max_bytes=1 << 30, flusher_process=False)
    url = str(tmp_path / "ledger")
    one = Ledger(url, worker="w1", spool=str(tmp_path / "host-1"), **settings)  # type: ignore[arg-type]
    two = Ledger(url, worker="w1", spool=str(tmp_path / "host-2"), **settings)  # type: ignore[arg-type]
    one.open()
    two.open()
    # When each writes its own trajectories
    _run(one, "a")
    _run(two, "b")
    # Then both are in the ledger
    assert sorted(read_table(url)["key"].to_pylist()) == ["a_s_0", "a_s_1", "b_s_0", "b_s_1"]


def test_a_segment_written_twice_gives_one_file_and_no_duplicate_rows(tmp_path: Path) -> None:
    # Given a segment written to the ledger whose worker died before deleting it (a copy put back)
    segment = spooled(tmp_path / "spool", [facts("a", 3), facts("b", 2)])
    kept = tmp_path / "copy.wal"
    shutil.copyfile(segment, kept)
    store = LedgerStore(str(tmp_path / "ledger"))
    first = write_segment(store, segment)
    assert first is not None and first.rows == 5 and not segment.exists()
    shutil.copyfile(kept, segment)
    # When it is written again (the next worker on the host adopts it)
    again = write_segment(store, segment)
    # Then it overwrote its own file: one file, each row once
    assert again is not None and again.rows == 5
    [file] = (tmp_path / "ledger").rglob("*.parquet")
    keys = pq.read_table(file)["key"].to_pylist()
    assert sorted(keys) == ["a_s_0", "a_s_1", "a_s_2", "b_s_0", "b_s_1"]


def test_a_dead_worker_is_adopted_without_a_live_worker_whose_name_extends_its_own(tmp_path: Path) -> None:
    # Given a dead worker "w1" and a live one named "w1.b", each with a segment
    live, dead, me = open_spools(tmp_path, "w1.b", "w1", "me", writing=("w1.b", "w1"))
    dead.close()
    # When another worker adopts the dead one's segments
    [orphan] = list(me.orphans())
    # Then it takes w1's segment only: w1.b is alive and still writing its own
    assert orphan.owner == "w1" and [p.name.startswith(f"w1.{dead.spool_id}-") for p in orphan.segments] == [True]
    orphan.release(remove=False)
    # And a worker's pending bytes are its own segments' only
    [own] = [p for p in tmp_path.glob("w1.*.wal") if p not in orphan.segments]
    assert live.pending_bytes() == own.stat().st_size


def test_a_clean_stop_leaves_no_lock_file_and_a_lock_on_a_deleted_one_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker's spool, and another process that opened its lock file's name meanwhile
    led = make_ledger(tmp_path)
    lock = tmp_path / "spool" / "w1.lock"
    assert lock.exists()
    stale = os.open(lock, os.O_RDWR)
    # When the worker stops cleanly
    _run(led, "a")
    # Then its lock file is gone with it (its rows are written)
    assert not list((tmp_path / "spool").iterdir())
    # And the other process, whose flock on the deleted file now succeeds, does not count it: it
    # locks the file the name holds now, so a third process that opens the name cannot take it too
    real_open = os.open
    opened = iter([stale])
    monkeypatch.setattr(os, "open", lambda *a, **k: next(opened, None) or real_open(*a, **k))
    fd = take_lock(lock)
    monkeypatch.undo()
    # (the stale descriptor was closed on the way, so the new one may reuse its number: compare files)
    assert fd is not None and os.fstat(fd).st_ino == os.stat(lock).st_ino
    assert take_lock(lock) is None
    os.close(fd)


def test_a_local_file_is_on_the_disk_before_its_segment_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a segment to write into a local ledger, with fsync, rename and unlink recorded
    segment = spooled(tmp_path / "spool", [facts("a", 3)])
    events: list[tuple[str, str]] = []
    fsync, rename, unlink = os.fsync, os.rename, Path.unlink

    def synced(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("fsync", "folder" if os.path.isdir(path) else Path(path).name))
        fsync(fd)

    def renamed(src: str, dst: str) -> None:
        events.append(("rename", Path(dst).name))
        rename(src, dst)

    def unlinked(self: Path, missing_ok: bool = False) -> None:
        events.append(("unlink", self.name))
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(os, "fsync", synced)
    monkeypatch.setattr(os, "rename", renamed)
    monkeypatch.setattr(Path, "unlink", unlinked)
    # When it is written
    written = write_segment(LedgerStore(str(tmp_path / "ledger")), segment)
    monkeypatch.undo()
    assert written is not None and written.rows == 3
    [file] = (tmp_path / "ledger").rglob("part-*.parquet")
    # Then the file was synced whole under its temporary name, renamed, its folder synced, and
    # only after that (and the manifest) the segment deleted: a power loss keeps the rows in one
    [(sync, temporary), *rest] = events
    assert sync == "fsync" and temporary.startswith("_tmp-") and temporary.endswith(file.name)
    assert rest[:2] == [("rename", file.name), ("fsync", "folder")]
    assert rest[-1] == ("unlink", segment.name) and [e for e in rest if e[0] == "unlink"] == [rest[-1]]
