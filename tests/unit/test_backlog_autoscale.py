"""The backlog drain figure (queue.reads.backlog_status), its gauge, and the autoscaling rule."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import generate_latest

from rewardq.consumers.metrics import WorkerMetrics
from rewardq.errors import ConfigError
from rewardq.integrations.ray.autoscale import Autoscale, Autoscaler
from rewardq.queue.reads import backlog_status, drain_estimate, shard_figures


def _shard(backlog: int, exact: bool = True) -> dict[str, Any]:
    return {"backlog": backlog, "backlog_exact": exact}


def test_drain_time_is_backlog_over_the_fleets_measured_rate() -> None:
    figures = backlog_status([_shard(300), _shard(100, exact=False)], [{"outputs_per_s": 30.0}, {"outputs_per_s": 10}])
    assert figures == {"entries": 400, "exact": False, "outputs_per_s": 40.0, "seconds": 10.0, "workers": 2}
    assert drain_estimate(0, 0.0) == 0.0  # nothing waits: drained
    assert drain_estimate(5, 0.0) is None  # entries wait and nothing scores: never, at this rate
    assert drain_estimate(1, 3.0) == 0.3


def test_shard_backlog_is_the_lag_or_else_the_entries_no_consumer_holds() -> None:
    groups = [{"name": b"other", "lag": 99}, {"name": b"g", "pending": 4, "consumers": 2, "lag": None}]
    sh = shard_figures(0, "ns:{s0}:stream", 10, groups, "g")
    assert (sh["backlog"], sh["backlog_exact"], sh["pending"], sh["group"]) == (6, False, 4, True)
    sh = shard_figures(0, "s", 10, [{"name": "g", "pending": 4, "lag": 3}], "g")
    assert (sh["backlog"], sh["backlog_exact"]) == (3, True)
    sh = shard_figures(0, "s", 7, None, "g")  # no group yet: every entry waits
    assert (sh["backlog"], sh["group"]) == (7, False)


def test_the_gauge_shows_infinity_while_nothing_drains() -> None:
    m = WorkerMetrics("naive")
    m.backlog({"entries": 12, "seconds": None})
    text = generate_latest(m.registry).decode()
    assert "rewardq_backlog_seconds +Inf" in text and "rewardq_backlog_entries 12.0" in text
    m.backlog({"entries": 12, "seconds": 3.5})
    assert "rewardq_backlog_seconds 3.5" in generate_latest(m.registry).decode()


def figures(entries: int, rate: float, workers: int) -> dict[str, Any]:
    return {"entries": entries, "outputs_per_s": rate, "workers": workers}


def test_wanted_workers_drain_the_backlog_within_the_target() -> None:
    p = Autoscale(min_workers=1, max_workers=10, target_drain_s=10)
    # 2 workers score 20 outputs/s together (10 each): 400 entries in 10 s needs 4 workers
    assert p.wanted(2, figures(400, 20.0, 2)) == 4
    assert p.wanted(2, figures(401, 20.0, 2)) == 5
    assert p.wanted(2, figures(10_000, 20.0, 2)) == 10  # capped at max
    assert p.wanted(5, figures(0, 20.0, 5)) == 1  # empty: down to min
    assert p.wanted(3, figures(50, 0.0, 3)) == 3  # nothing measured yet: keep
    assert Autoscale(min_workers=0, max_workers=4).wanted(0, figures(50, 0.0, 0)) == 1  # a backlog needs someone
    assert Autoscale(min_workers=0, max_workers=4).wanted(2, figures(0, 0.0, 2)) == 0


def test_up_at_once_down_only_after_the_window_and_to_the_most_wanted_in_it() -> None:
    a = Autoscaler(Autoscale(min_workers=1, max_workers=8, target_drain_s=10, scale_down_after_s=30))
    assert a.decide(0.0, 2, figures(800, 20.0, 2)) == 8  # wants 8: at once
    assert a.decide(10.0, 8, figures(100, 80.0, 8)) == 8  # wants 1, but not for 30 s yet
    assert a.decide(20.0, 8, figures(300, 80.0, 8)) == 8  # wants 3
    assert a.decide(35.0, 8, figures(0, 80.0, 8)) == 8  # the window still holds the 8 wanted at t=0..
    assert a.decide(45.0, 8, figures(0, 80.0, 8)) == 3  # 30 s of fewer wanted: down to the most among them
    assert a.decide(60.0, 3, figures(0, 0.0, 3)) == 3
    assert a.decide(80.0, 3, figures(0, 0.0, 3)) == 1
    assert a.last["wanted"] == 1 and a.last["target"] == 1


def test_an_unsteady_interval_still_scales_down() -> None:
    a = Autoscaler(Autoscale(min_workers=1, max_workers=4, scale_down_after_s=20))
    t, current = 0.0, 4
    while t < 100 and current > 1:
        current = a.decide(t, current, figures(0, 1.0, current))
        t += 10.37  # never a multiple of the window
    assert current == 1 and t < 40


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_workers": 3, "max_workers": 2},
        {"max_workers": 0},
        {"min_workers": -1},
        {"target_drain_s": 0},
        {"interval_s": -1},
        {"scale_down_after_s": -1},
    ],
)
def test_a_bad_policy_is_refused_naming_the_setting(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="autoscale"):
        Autoscale(**kwargs)


def test_a_policy_from_a_config_block_takes_short_names_and_refuses_unknown_ones() -> None:
    assert Autoscale.from_mapping({"min": 2, "max": 6, "target": 30}) == Autoscale(2, 6, 30.0)
    with pytest.raises(ConfigError, match="unknown setting 'maxx'"):
        Autoscale.from_mapping({"maxx": 3})
    assert math.isfinite(Autoscale().target_drain_s)
