"""A replay's ``--out`` record (``_rewardq_replay.json``) is written whole or not at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileOpener

from rewardq.ledger import replay as rp


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
