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
    rp.check_out(str(a), str(a) + "-replay")  # a sibling sharing its name's start


def test_the_report_counts_every_trajectory_and_failure_incomplete_ones_too(tmp_path: Path) -> None:
    from rewardq.ledger.report import load, per_source, render

    rows = load(str(_ledger(tmp_path / "a")), None, None, None)
    assert (rows.n, int((~rows.ok).sum())) == (4, 3)
    (gsm8k,) = per_source(rows)
    assert (gsm8k["trajectories"], gsm8k["errors"]) == (4, 3)
    assert sorted(rows.failure_kind[~rows.ok].tolist()) == ["input", "input", "scorer"]
    assert 'data-trajectories="4" data-errors="3"' in render(str(tmp_path / "a"), rows)


def test_trajectories_never_scored_are_left_out_of_the_latency_figures(tmp_path: Path) -> None:
    from rewardq.ledger.report import load, per_source, render

    # Given two scored trajectories (5 ms) and two ended incomplete after waiting 45 s
    rows = load(str(_ledger(tmp_path / "a")), None, None, None)
    # Then the latency figures are the scored ones', and the page says how many were left out
    (gsm8k,) = per_source(rows)
    assert (gsm8k["latency_p50_ms"], gsm8k["latency_p99_ms"]) == (5.0, 5.0)
    assert int(rows.unscored.sum()) == 2
    page = render(str(tmp_path / "a"), rows)
    assert 'data-unscored="2"' in page and "2 never scored" in page


def test_a_trajectory_without_a_result_time_is_counted_but_on_no_time_axis(tmp_path: Path) -> None:
    from rewardq.ledger.report import load, render

    untimed = trajectory_rows("late", 1, status="error")
    untimed[0]["scored_at"] = None
    rows = load(str(write_ledger(tmp_path / "a", trajectory_rows("a", 2) + untimed)), None, None, None)
    assert (rows.n, int((~rows.ok).sum())) == (2, 1)
    assert "1 without a result time" in render(str(tmp_path / "a"), rows)


def test_a_report_into_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    from rewardq.ledger.report import write_report

    with pytest.raises(ConfigError, match="folder"):
        write_report(str(_ledger(tmp_path / "a")), str(tmp_path / "missing" / "r.html"))


def test_a_diff_that_compares_nothing_warns_and_exits_2(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rewardq.cli import cli

    a = _ledger(tmp_path / "a")
    empty = tmp_path / "empty"
    empty.mkdir()
    for b in (empty, write_ledger(tmp_path / "other", trajectory_rows("zz", 1))):
        r = CliRunner().invoke(cli, ["diff", str(a), str(b), "--json"], standalone_mode=False)
        assert r.return_value == 2 and "nothing compared" in r.stderr, r.output
        assert '"compared": 0' in r.stdout
    r = CliRunner().invoke(cli, ["diff", str(a), str(a), "--json"], standalone_mode=False)
    assert r.return_value == 0 and "warning" not in r.stderr


def test_a_replay_without_a_tokenizer_is_refused_before_it_reads_or_draws(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rewardq.cli import cli

    a = _ledger(tmp_path / "a")
    r = CliRunner().invoke(cli, ["replay", str(a), "--out", str(tmp_path / "out")], standalone_mode=False)
    assert isinstance(r.exception, ConfigError) and "tokenizer" in str(r.exception)
    assert "replaying" not in r.stderr and not (tmp_path / "out").exists()
