"""A worker's published rates, data-source counts and median latency are exact at any speed
(:class:`rewardq.consumers.presence.Presence`, on a clock the test drives)."""

from __future__ import annotations

import json

from rewardq.consumers.presence import HISTORY_S, Presence


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _presence(clock: Clock) -> Presence:
    return Presence(manager_name="naive", stats={}, in_flight={}, clock=clock)


def test_rates_and_source_counts_are_exact_at_2000_outputs_per_second() -> None:
    """250 trajectories of 8 outputs a second (2,000 outputs/s) for 70 s, alternating two data sources."""
    clock = Clock(1000.0)
    p = _presence(clock)
    per_s, outputs, seconds = 250, 8, 70
    times = [1000.0 + k / per_s for k in range(per_s * seconds)]
    for k, t in enumerate(times):
        clock.t = t
        p.scored(12.0, outputs=outputs)
        p.finished("gsm8k" if k % 2 else "math", 0.004)
    clock.t = 1000.0 + seconds
    snap = p.snapshot()
    assert snap["rate"] == 250.0 and snap["outputs_rate"] == 2000.0, snap
    # "slowest data sources (last 60 s)": every trajectory of the window counted, none capped
    window = [t for t in times if t >= clock.t - HISTORY_S + 1 - (clock.t % 1)]
    sources = json.loads(snap["sources"])
    assert sources["gsm8k"]["n"] + sources["math"]["n"] == len(window) > 4096, (sources, len(window))
    assert abs(sources["gsm8k"]["n"] - sources["math"]["n"]) <= 1
    assert len(p._seconds) <= HISTORY_S  # memory bounded by the window, not the traffic


def test_rates_cover_a_partial_second_and_a_young_worker() -> None:
    clock = Clock(500.0)
    p = _presence(clock)
    for k in range(3 * 100):  # 100 trajectories a second for 3 s, then read half-way through a second
        clock.t = 500.0 + k / 100
        p.scored(5.0, outputs=4)
    clock.t = 503.0
    rate, outputs_rate = p.rates()
    assert rate == 100.0 and outputs_rate == 400.0
    clock.t = 520.0  # nothing scored for 17 s: nothing in the last 10 s
    assert p.rates() == (0.0, 0.0)


def test_median_latency_weighs_each_second_by_what_it_scored() -> None:
    """One busy second of slow trajectories outweighs five quiet seconds of fast ones."""
    clock = Clock(2000.0)
    p = _presence(clock)
    for s in range(5):
        for k in range(50):
            clock.t = 2000.0 + s + k / 50
            p.scored(10.0)
    for k in range(1000):
        clock.t = 2005.0 + k / 1000
        p.scored(500.0)
    clock.t = 2006.0
    assert p.snapshot()["latency_p50_ms"] == 500.0  # 1,000 of 1,250 took 500 ms
