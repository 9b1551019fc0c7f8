"""``rewardq status`` rendered at 80 columns (the width when output is not a terminal) cuts no word,
with no live worker or with waiting trajectories of any id length; and its diagnosis tells a
trajectory waiting behind a draining backlog from one whose output never came."""

from __future__ import annotations

import copy
import io
import time
from typing import Any

import pytest
from rich.console import Console

from rewardq.ops.diagnosis import diagnose
from rewardq.ops.overview import ledger_totals
from rewardq.ops.status_view import ledger_line, render_status
from tests.support.helpers import top_snapshot


def _status(**changes: Any) -> dict[str, Any]:
    """A status dict as :func:`rewardq.ops.status.collect` builds it: one shard, nothing running."""
    st: dict[str, Any] = {
        "namespace": "step-ns",
        "group": "rewardq-workers",
        "scoring": None,
        "shards": [
            {"shard": 0, "length": 0, "lag": 0, "pending": 0, "group": True, "backlog": 0, "backlog_exact": True}
        ],
        "backlog": {"entries": 0, "exact": True, "outputs_per_s": 0.0, "seconds": 0.0, "workers": 0},
        "workers": [],
        "code": {},
        "failures": {},
        "retrying": {"n": 0, "waiting": []},
        "ledger": None,
        "reward_health": [],
        "judges": {},
        "dead_letters": 0,
        "dead_letters_by_kind": {},
        "waiting_total": 0,
        "waiting": [],
        "recent": {
            "window_s": 60.0,
            "trajectories": 0,
            "errors": 0,
            "trajectories_per_s": 0.0,
            "latency_ms_p50": None,
            "latency_ms_p99": None,
        },
        "time": time.time(),
        "redis_url": "redis://127.0.0.1:6379/0",
        "shard_count": 1,
    }
    st.update(changes)
    st["diagnosis"] = diagnose(st)
    return st


def _waiting(tid: str, **changes: Any) -> dict[str, Any]:
    w = {
        "tid": tid,
        "shard": 0,
        "have": [0, 2],
        "final": 2,
        "missing": [1],
        "waiting_for": "outputs 1",
        "waited_s": 3700.0,
        "expires_in_s": 10805.0,
        "behind_backlog": 0,
    }
    w.update(changes)
    return w


def _at_80(st: dict[str, Any]) -> str:
    console = Console(width=80, record=True, highlight=False, file=io.StringIO())
    console.print(render_status(st, console=console))
    return console.export_text()


def _cuts_nothing(out: str) -> None:
    wide = [line for line in out.splitlines() if len(line.rstrip()) > 80]
    assert not wide, "\n".join(wide)
    assert "…" not in out, out


def test_no_live_worker_at_80_columns_cuts_no_header() -> None:
    out = _at_80(_status())
    _cuts_nothing(out)
    assert "live workers (0): none" in out


@pytest.mark.parametrize("length", range(4, 64, 2))
def test_waiting_trajectories_at_80_columns_cut_no_header_or_value(length: int) -> None:
    """Ids of every length: a table that fits keeps "given up in" whole, one that does not is stacked."""
    tid = "t" * length
    out = _at_80(_status(waiting=[_waiting(tid)], waiting_total=1))
    _cuts_nothing(out)
    assert tid in out.split()
    assert "given up in" in " ".join(out.split())


def test_a_trajectory_behind_a_draining_backlog_is_no_false_alarm() -> None:
    """Its output is still unread in its shard's stream (lag): the backlog drains, nobody is told to
    check the rollout side."""
    shards = [{"shard": 0, "length": 14_496, "lag": 14_496, "pending": 8, "group": True, "backlog": 14_496}]
    shards[0]["backlog_exact"] = True
    backlog = {"entries": 14_496, "exact": True, "outputs_per_s": 800.0, "seconds": 18.1, "workers": 2}
    waiting = [_waiting("behind", missing=[], final=None, waiting_for="the final output", behind_backlog=14_496)]
    st = _status(shards=shards, backlog=backlog, waiting=waiting, waiting_total=1)
    lines = [d for d in st["diagnosis"] if "rollout side" in d["message"]]
    assert not lines, st["diagnosis"]
    draining = [d for d in st["diagnosis"] if "backlog is draining" in d["message"]]
    assert draining and draining[0]["level"] == "ok", st["diagnosis"]
    out = _at_80(st)
    _cuts_nothing(out)
    assert "behind 14,496 unread" in " ".join(out.split())

    # the same trajectory on a shard with nothing unread: its output never came
    quiet = copy.deepcopy(shards)
    quiet[0].update(length=0, lag=0, backlog=0)
    st = _status(shards=quiet, waiting=[_waiting("behind", missing=[], final=None)], waiting_total=1)
    warned = [d for d in st["diagnosis"] if "rollout side" in d["message"]]
    assert warned and warned[0]["level"] == "warning" and "its final output" in warned[0]["message"]


def test_a_trajectory_given_up_before_the_backlog_drains_is_warned_about() -> None:
    shards = [{"shard": 0, "length": 90_000, "lag": 90_000, "pending": 0, "group": True, "backlog": 90_000}]
    shards[0]["backlog_exact"] = True
    backlog = {"entries": 90_000, "exact": True, "outputs_per_s": 50.0, "seconds": 1800.0, "workers": 1}
    waiting = [_waiting("late", expires_in_s=120.0, behind_backlog=90_000)]
    st = _status(shards=shards, backlog=backlog, waiting=waiting, waiting_total=1)
    late = [d for d in st["diagnosis"] if "given up before it ends" in d["message"]]
    assert late and late[0]["level"] == "warning" and "--incomplete-timeout" in late[0]["message"], st["diagnosis"]


def test_diagnosis_commands_stand_on_lines_of_their_own_at_80_columns() -> None:
    """The prose wraps between words; each command it asks for is one whole line, indented, that
    runs as it is copied (the JSON carries the same commands, in the order the prose names them)."""
    shards = [{"shard": 0, "length": 3, "lag": 3, "pending": 0, "group": True, "backlog": 3, "backlog_exact": True}]
    st = _status(shards=shards, dead_letters=2, dead_letters_by_kind={"invalid": 2})
    nothing = next(d for d in st["diagnosis"] if "nothing is being scored" in d["message"])
    assert nothing["commands"] == ["rewardq worker --namespace step-ns"]
    dead = next(d for d in st["diagnosis"] if "2 dead letters" in d["message"])
    assert dead["commands"] == [
        "rewardq dead-letters list --namespace step-ns",
        "rewardq dead-letters retry --all --namespace step-ns",
    ]
    assert all("rewardq " not in d["message"] for d in st["diagnosis"]), st["diagnosis"]  # prose only
    out = _at_80(st)
    _cuts_nothing(out)
    lines = out.splitlines()
    for command in (*nothing["commands"], *dead["commands"]):
        assert "    " + command in lines, out
    first = lines.index(next(line for line in lines if line.startswith("! nothing is being scored")))
    command = lines.index("    rewardq worker --namespace step-ns")
    assert command - first == 3 and lines[command - 1].endswith("--namespace):"), out  # the prose took 3 lines


def test_a_command_wider_than_the_screen_is_continued_as_one_shell_command() -> None:
    ns = "n" * 60  # the command is wider than the screen, its words are not
    st = _status(namespace=ns, waiting=[_waiting("t1")], waiting_total=1)
    out = _at_80(st)
    _cuts_nothing(out)
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("rewardq inspect t1"))
    assert lines[at].endswith(" \\") and lines[at + 1].strip() == ns, out
    assert " ".join(w for line in lines[at : at + 2] for w in line.split() if w != "\\") == (
        f"rewardq inspect t1 --namespace {ns}"
    )


def _health_row(**changes: Any) -> dict[str, Any]:
    row = {
        "data_source": "gsm8k",
        "trajectories": 40,
        "mean_reward": 0.5,
        "error_share": 0.0,
        "errors_by_kind": {},
        "p99_ms": 120.0,
        "baseline_trajectories": 400,
        "baseline_mean_reward": 0.52,
        "baseline_error_share": 0.0,
        "jumps": [],
    }
    row.update(changes)
    return row


def test_reward_health_says_what_changed_sharply_none_or_too_few_to_judge() -> None:
    judged, jumped = _health_row(), _health_row(data_source="math", jumps=["mean reward 0.520 -> 0.100"])
    few = _health_row(data_source="code", trajectories=5)
    out = " ".join(_at_80(_status(reward_health=[judged, jumped, few])).split())
    assert "sharp change none" in out and "sharp change mean reward 0.520 -> 0.100" in out, out
    assert "sharp change too few to judge" in out and "mean before 0.520" in out, out
    assert "steady" not in out and "jumped" not in out


def test_reward_health_shows_the_earlier_error_share_beside_the_earlier_mean() -> None:
    rising = _health_row(error_share=0.25, baseline_error_share=0.05)
    fresh = _health_row(data_source="new", baseline_trajectories=0, baseline_mean_reward=None)
    out = " ".join(_at_80(_status(reward_health=[rising, fresh])).split())
    assert "errors 25.0% · errors before 5.0%" in out, out
    assert "errors before 0.0%" not in out, out  # a source with no earlier trajectories has no share


def test_top_shows_each_data_sources_error_share_by_kind_beside_the_10_minutes_before() -> None:
    from rewardq.ops.top import render_top

    flaky = _health_row(data_source="judge", error_share=0.25, errors_by_kind={"input": 0.05, "timeout": 0.2})
    fresh = _health_row(data_source="new", baseline_trajectories=0, baseline_mean_reward=None)
    snap = {**top_snapshot(), "reward_health": [_health_row(baseline_error_share=0.05), flaky, fresh]}
    for width in (160, 80):  # a table where it fits, stacked blocks where it does not: the same facts
        console = Console(width=width, record=True, color_system=None)
        console.print(render_top(snap, width))
        text = console.export_text()
        if width == 80:
            _cuts_nothing(text)
        out = " ".join(text.split())
        assert "the 10 minutes before" in out, out
        assert "input 5%, timeout 20%" in out and "25.0%" in out, out
    console = Console(width=160, record=True, color_system=None)
    console.print(render_top(snap, 160))
    lines = {line.split()[0]: line for line in console.export_text().splitlines() if line.strip()}
    assert lines["gsm8k"].split()[1:6] == ["40", "0.500", "0.520", "0.0%", "5.0%"], lines
    assert lines["new"].split()[1:6] == ["40", "0.500", "-", "0.0%", "-"], lines


def test_the_ledger_line_says_its_rows_are_the_live_workers_since_each_started() -> None:
    def worker(name: str, rows: int) -> dict[str, Any]:
        return {"name": name, "ledger": {"url": "/data/ledger", "rows": rows, "state": "ok"}}

    # two live workers' heartbeats: their current processes' counts, not every row in the ledger
    line = ledger_line(ledger_totals([worker("w0", 1200), worker("w1", 34)]) or {})
    assert "/data/ledger: 1,234 rows written by the 2 live workers since each started" in line, line
    line = ledger_line(ledger_totals([worker("w0", 7)]) or {})
    assert "7 rows written by the live worker since it started" in line, line
