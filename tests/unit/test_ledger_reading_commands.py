"""What replay's plan, diff and report make of a ledger: hand-made ledgers, no worker."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from rewardq.errors import ConfigError
from rewardq.ledger import replay as rp
from rewardq.ledger.diff import compare
from tests.support.ledger_rows import T0, trajectory_rows, write_ledger


def _ledger(root: Path) -> Path:
    """Two complete trajectories (one with an error) and two ended by incomplete_timeout."""
    rows = trajectory_rows("a", 2, second=0) + trajectory_rows("b", 1, status="error", second=1)
    rows += trajectory_rows("inc0", 1, complete=False, second=2) + trajectory_rows("inc1", 3, complete=False, second=3)
    return write_ledger(root, rows)


def test_a_trajectory_whose_final_output_never_arrived_is_counted_incomplete_not_replayed(tmp_path: Path) -> None:
    p = rp.plan(str(_ledger(tmp_path / "a")))
    assert [t.uid for t in p.trajectories] == ["a", "b"]
    assert p.incomplete == 2 and p.unreadable == 0


def test_filters_select_whole_trajectories_and_every_one_selected_is_accounted_for(tmp_path: Path) -> None:
    # Given 8 complete trajectories of 3 outputs and one whose final output never arrived
    rows = [r for i in range(8) for r in trajectory_rows(f"t{i}", 3, second=i)]
    rows += trajectory_rows("inc", 2, complete=False, second=9)
    a = str(write_ledger(tmp_path / "a", rows))
    # When a replay filters on a per-output column and limits the count
    p = rp.plan(a, where={"index": ["0"]}, limit=5)
    # Then each trajectory with a matching row is replayed whole, --limit counting trajectories
    assert [t.uid for t in p.trajectories] == ["t0", "t1", "t2", "t3", "t4"]
    assert all(len(t.outputs) == 3 for t in p.trajectories)
    # And only the trajectory whose final output never arrived is incomplete; the rest are past the limit
    assert (p.selected, p.incomplete, p.rows_missing, p.unreadable, p.over_limit) == (9, 1, 0, 0, 3)
    # And a row filter that matches one output only (the final one) still takes the whole trajectory
    p = rp.plan(a, where={"final": ["true"], "uid": ["t6"]})
    assert [(t.uid, len(t.outputs)) for t in p.trajectories] == [("t6", 3)] and p.selected == 1


def test_a_time_range_takes_a_trajectory_whose_rows_straddle_it_whole(tmp_path: Path) -> None:
    # Given a trajectory whose first output was scored a minute before its last
    rows = trajectory_rows("late", 2, second=60)
    rows[0]["scored_at"] = T0
    a = str(write_ledger(tmp_path / "a", rows + trajectory_rows("early", 1)))
    # When the replay takes the rows from 30 s on
    p = rp.plan(a, since=(T0 + dt.timedelta(seconds=30)).isoformat())
    # Then that trajectory is replayed with both outputs, and the earlier one not at all
    assert [(t.uid, len(t.outputs)) for t in p.trajectories] == [("late", 2)]
    assert (p.selected, p.incomplete) == (1, 0)


def test_a_final_trajectory_missing_a_row_is_counted_as_such_not_incomplete(tmp_path: Path) -> None:
    # Given a scored trajectory of 3 outputs whose middle row never reached the ledger
    rows = [r for r in trajectory_rows("hole", 3) if r["index"] != 1]
    p = rp.plan(str(write_ledger(tmp_path / "a", rows)))
    assert (p.trajectories, p.incomplete, p.rows_missing) == ([], 0, 1)


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


def test_the_diff_table_at_80_columns_cuts_no_data_source_or_key(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rewardq.cli import cli

    # Given two ledgers whose rewards differ, with long data source names and a long key
    uid = "a-very-long-uid-1234567890abcdef-0123456789"
    sources = ("openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval")
    before = trajectory_rows(uid, 1, data_source=sources[0]) + trajectory_rows("b", 1, data_source=sources[1])
    after = trajectory_rows(uid, 1, score=0.0, data_source=sources[0]) + trajectory_rows("b", 1, data_source=sources[1])
    a, b = write_ledger(tmp_path / "a", before), write_ledger(tmp_path / "b", after)
    # When the diff prints at 80 columns (a pipe's width)
    r = CliRunner().invoke(cli, ["diff", str(a), str(b)], standalone_mode=False, env={"COLUMNS": "80"})
    assert r.return_value == 0, r.output
    lines = r.stdout.splitlines()
    # Then every line fits, and each name and key is whole on one line
    assert max(map(len, lines)) <= 80, r.stdout
    for whole in (*sources, f"{uid}_0_0"):
        assert any(whole in line for line in lines), (whole, r.stdout)
    # And with --wide the tables are kept whole, however wide
    r = CliRunner().invoke(cli, ["diff", str(a), str(b), "--wide"], standalone_mode=False, env={"COLUMNS": "80"})
    assert any(line.split()[:2] == ["data", "source"] for line in r.stdout.splitlines()), r.stdout


def test_a_record_without_a_data_source_is_counted_under_one_word_everywhere(tmp_path: Path) -> None:
    from rewardq.consumers.presence import Presence
    from rewardq.consumers.reward_health import RewardHealth
    from rewardq.ledger.report import load, per_source

    # Given a refused record whose data source is not known, in the ledger and in a worker's counts
    ledger = write_ledger(tmp_path / "a", trajectory_rows("r", 1, status="error", data_source=""))
    health = RewardHealth()
    health.record("", reward=None, failure_kind="input", latency_ms=1.0)
    presence = Presence(manager_name="m", stats={}, in_flight={})
    presence.failed("", "input")
    # Then the report, the health windows (status's "mean before") and the heartbeat (status, top)
    # all name it "unknown"
    assert [s["data_source"] for s in per_source(load(str(ledger), None, None, None))] == ["unknown"]
    assert list(health.windows()) == ["unknown"]
    assert list(presence.failures) == ["unknown"]


def test_the_reports_standard_deviation_is_the_populations_and_says_so(tmp_path: Path) -> None:
    from rewardq.ledger.report import load, per_source, summary_table

    # Given two trajectories of one data source, rewarded 0 and 1
    ledger = write_ledger(tmp_path / "a", trajectory_rows("x", 1, score=0.0) + trajectory_rows("y", 1, score=1.0))
    (gsm8k,) = per_source(load(str(ledger), None, None, None))
    # Then its std is over n (0.5), not n - 1 (0.707), and the table's header says which
    assert gsm8k["std_reward"] == 0.5
    assert "<th>std reward (population)</th>" in summary_table([gsm8k])
