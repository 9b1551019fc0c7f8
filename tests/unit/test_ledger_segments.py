"""The flusher reads a segment in pieces and writes it row group by row group: the same rows as
building the tables from the whole segment, whatever the row groups, frame sizes and reuse of
its buffers from segment to segment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rewardq.ledger import flusher
from rewardq.ledger.frames import SegmentFile, Skipped, outcome_frame, read_frames, trajectory_frame
from rewardq.ledger.store import LedgerStore
from rewardq.ledger.table import tables_from_frames
from tests.support.ledger_facts import facts

HOUR = 3600.0


def _segment(path: Path, uids: list[str], *, hours: int = 1, n: int = 3) -> bytes:
    """Trajectories ``uids`` (each outcome one frame late, the last one never), spread over ``hours``."""
    data = b""
    for i, uid in enumerate(uids):
        data += trajectory_frame(i + 1, facts(uid, n, scored_at=1.8e9 + HOUR * (i % hours), attempt=i + 1))
        if i:
            data += outcome_frame(i, i % 3 != 1)
    path.write_bytes(data)
    return data


def _written(root: Path) -> dict[str, pa.Table]:
    return {str(p.relative_to(root)): pq.read_table(p) for p in sorted(root.glob("date=*/hour=*/*.parquet"))}


def _expected(data: bytes) -> list[pa.Table]:
    return list(tables_from_frames(read_frames(data)).values())


@pytest.mark.parametrize(("group_bytes", "groups"), [(1, 6), (150, 3), (1 << 30, 1)])
def test_row_groups_hold_the_rows_building_the_whole_segment_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group_bytes: int, groups: int
) -> None:
    monkeypatch.setattr(flusher, "ROW_GROUP_BYTES", group_bytes)
    segment = tmp_path / "w.0000000007.wal"
    data = _segment(segment, [f"u{i}" for i in range(12)], hours=2)
    store = LedgerStore(str(tmp_path / "ledger"))
    written = flusher.write_segment(store, segment)
    assert written is not None and (written.rows, written.files, written.skipped.frames) == (36, 2, 0)
    assert not segment.exists()
    files = _written(tmp_path / "ledger")
    assert [t.equals(e) for t, e in zip(files.values(), _expected(data))] == [True, True]
    [first, _] = files
    # 96 bytes of ids per trajectory, 6 trajectories per hour: a group per 1, 2 or 6 trajectories
    assert pq.ParquetFile(tmp_path / "ledger" / first).metadata.num_row_groups == groups
    committed = pa.concat_tables(files.values())["committed"].to_pylist()
    assert committed.count(None) == 3  # the last trajectory's outcome never came


def test_buffers_kept_between_segments_change_no_file_written_before(tmp_path: Path) -> None:
    store = LedgerStore(str(tmp_path / "ledger"))
    first = tmp_path / "w.0000000001.wal"
    data = _segment(first, [f"a{i}" for i in range(5)])
    flusher.write_segment(store, first)
    before = _written(tmp_path / "ledger")
    second = tmp_path / "w.0000000002.wal"
    _segment(second, [f"b{i}" for i in range(5)], n=5)
    flusher.write_segment(store, second)
    after = _written(tmp_path / "ledger")
    assert len(after) == 2 and all(after[name].equals(t) for name, t in before.items())
    [table] = before.values()
    assert table.equals(_expected(data)[0])
    assert np.frombuffer(table["response_ids"][2].as_py(), "<i4").tolist() == [0, 1, 2, 3, 4, 5]


def test_the_segment_file_stops_where_the_bytes_stop(tmp_path: Path) -> None:
    big = facts("big", 2)
    big.sample = {"data_source": "x", "extra_info": {"pad": "z" * 40_000}}  # a map longer than one read
    data = trajectory_frame(1, facts("a")) + trajectory_frame(2, big) + outcome_frame(2, True)
    for cut, whole in ((len(data), 3), (len(data) - 3, 2), (len(data) - 40, 1), (100, 0)):
        path = tmp_path / f"cut{cut}.wal"
        path.write_bytes(data[:cut])
        with path.open("rb") as f:
            segment = SegmentFile(f)
            found = []
            for frame, start, raw in segment.frames():
                assert segment.complete(frame, start, raw)
                found.append(frame)
        assert [(f["k"], f.get("u")) for f in found] == [(f["k"], f.get("u")) for f in read_frames(data[:cut])]
        assert len(found) == whole


def _write(tmp_path: Path, data: bytes) -> tuple[flusher.Written | None, Path]:
    path = tmp_path / "w.0000000001.wal"
    path.write_bytes(data)
    return flusher.write_segment(LedgerStore(str(tmp_path / "ledger")), path), path


def test_a_torn_last_frame_is_not_damage_wherever_it_is_cut(tmp_path: Path) -> None:
    whole = trajectory_frame(1, facts("a")) + outcome_frame(1, True)
    last = trajectory_frame(2, facts("b"))
    map_end = 4 + int.from_bytes(last[:4], "little")
    for cut in (2, 4, 5, map_end - 1, map_end, map_end + 3, len(last) - 1):
        written, path = _write(tmp_path, whole + last[:cut])
        assert written is not None and written.rows == 2, cut
        # (its frames come without the provenance frame the worker writes: said, not lost)
        assert written.skipped == Skipped(torn_bytes=cut, no_provenance=1) and written.skipped.frames == 0, cut
        assert written.kept is None and not path.exists()


def test_damage_before_the_last_frame_is_unreadable_not_torn(tmp_path: Path) -> None:
    a, b, c = (trajectory_frame(i, facts(u)) for i, u in enumerate("abc", 1))
    bad_map = bytearray(b)
    bad_map[4] = 0xC1  # its map's first byte: never valid msgpack
    long_prefix = (len(b) + len(c) + 100).to_bytes(4, "little") + b[4:]  # claims more than follows
    for damaged in (bytes(bad_map), long_prefix):
        written, path = _write(tmp_path, a + damaged + c)
        assert written is not None and written.rows == 2  # a's; c, after the damage, cannot be found
        assert written.skipped == Skipped(unreadable_bytes=len(b) + len(c), no_provenance=1)
        assert written.skipped.frames == 1
        assert written.kept == str(path) + ".unreadable" and not path.exists()
        Path(written.kept).unlink()
