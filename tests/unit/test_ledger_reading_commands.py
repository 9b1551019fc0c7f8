"""What replay's plan, diff and report make of a ledger: hand-made ledgers, no worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from rewardq.errors import ConfigError
from rewardq.ledger import replay as rp
from rewardq.ledger.diff import compare
from tests.support.ledger_rows import trajectory_rows, write_ledger


def _ledger(root: Path) -> Path:
    """Two complete trajectories (one with an error) and two ended by incomplete_timeout."""
    rows = trajectory_rows("a", 2, second=0) + trajectory_rows("b", 1, status="error", second=1)
    rows += trajectory_rows("inc0", 1, complete=False, second=2) + trajectory_rows("inc1", 3, complete=False, second=3)
    return write_ledger(root, rows)


def test_a_trajectory_whose_final_output_never_arrived_is_counted_incomplete_not_replayed(tmp_path: Path) -> None:
    p = rp.plan(str(_ledger(tmp_path / "a")))
    assert [t.uid for t in p.trajectories] == ["a", "b"]
    assert p.incomplete == 2 and p.unreadable == 0


def test_keys_a_replay_left_out_are_only_before_never_changed(tmp_path: Path) -> None:
    a = _ledger(tmp_path / "a")
    b = write_ledger(tmp_path / "b", trajectory_rows("a", 2) + trajectory_rows("b", 1, status="error"))
    d = compare(str(a), str(b))
    assert (d["compared"], d["changed"], d["newly_failed"], d["newly_scored"]) == (3, 0, 0, 0)
    assert (d["only_before"], d["only_after"]) == (4, 0)


def test_an_output_ledger_inside_its_source_is_refused(tmp_path: Path) -> None:
    a = _ledger(tmp_path / "a")
    for out in (a, a / "replay", tmp_path):
        with pytest.raises(ConfigError, match="--out"):
            rp.check_out(str(a), str(out))
    rp.check_out(str(a), str(tmp_path / "b"))
