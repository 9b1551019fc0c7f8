"""A replay's ``--out`` record (``_rewardq_replay.json``) is written whole or not at all, and on a local
folder is on the disk before its name points at it (a power loss leaves no empty record)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileOpener

from rewardq.ledger import replay as rp
from rewardq.queue.namespace import ReplayMark
from rewardq.replay.namespace import replay_mark


def test_a_stop_in_the_middle_of_writing_the_record_leaves_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an --out whose record was written
    out = str(tmp_path / "out")
    first = {"source": "a", "scoring": "fp-1", "id": "out-1"}
    rp.write_record(out, first)
    # When a SIGINT (KeyboardInterrupt) stops the next write after its first bytes
    write = LocalFileOpener.write

    def cut(self: LocalFileOpener, data: Any) -> int:
        write(self, data[:10])
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalFileOpener, "write", cut)
    with pytest.raises(KeyboardInterrupt):
        rp.write_record(out, {**first, "text": "x" * 1000})
    monkeypatch.undo()
    # Then the record reads as it was, and nothing else is left in the folder
    assert rp.read_record(out) == first
    assert sorted(p.name for p in Path(out).iterdir()) == [rp.RECORD]


def test_a_stop_in_the_middle_of_the_first_record_leaves_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = str(tmp_path / "out")

    def cut(self: LocalFileOpener, data: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalFileOpener, "write", cut)
    with pytest.raises(KeyboardInterrupt):
        rp.write_record(out, {"source": "a", "scoring": "fp-1", "id": "out-1"})
    monkeypatch.undo()
    assert rp.read_record(out) is None  # the next run starts afresh instead of refusing a cut record


def test_a_local_record_is_fsynced_before_its_rename_and_the_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    events: list[tuple[str, ...]] = []
    fsync, rename = os.fsync, os.rename

    def synced(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        size = "folder" if os.path.isdir(path) else str(os.fstat(fd).st_size)
        events.append(("fsync", Path(path).name, size))
        fsync(fd)

    def renamed(src: str, dst: str) -> None:
        events.append(("rename", Path(src).name, Path(dst).name))
        rename(src, dst)

    monkeypatch.setattr(os, "fsync", synced)
    monkeypatch.setattr(os, "rename", renamed)
    rp.write_record(str(out), {"source": "a", "scoring": "fp-1", "id": "out-1"})
    monkeypatch.undo()
    size = str((out / rp.RECORD).stat().st_size)
    [(_, temporary, written), *rest] = events
    # the temporary file, whole, then its rename, then the folder holding the new name
    assert temporary.startswith("_tmp-") and written == size
    assert rest == [("rename", temporary, rp.RECORD), ("fsync", "out", "folder")]


def test_a_replay_mark_is_told_by_its_out_id_and_scoring_not_by_how_its_out_is_spelt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the mark of a replay into an --out given as a relative path
    monkeypatch.chdir(tmp_path)
    mark = replay_mark("out-1", "fp-1", "new")
    # Then it names that --out absolute, and reads back as itself
    assert mark.path == str(tmp_path / "new") and ReplayMark.decode(mark.encode().encode()) == mark
    # and a resume that spells the --out another way, or a mark that does not name it, is the same replay
    assert replay_mark("out-1", "fp-1", str(tmp_path / "new")) == mark
    assert ReplayMark.decode('{"out": "out-1", "scoring": "fp-1"}') == mark
    # but another --out or configuration is not; nor is a value that is not a mark
    assert replay_mark("out-2", "fp-1", "new") != mark and replay_mark("out-1", "fp-2", "new") != mark
    garbage = ReplayMark.decode(b"\xffnot json")
    assert garbage is not None and garbage != ReplayMark("", "") and "unreadable" in garbage.out
    # a ledger URL is named with its password redacted
    assert replay_mark("out-1", "fp-1", "s3://me:secret@bucket/new").path == "s3://me:***@bucket/new"
