"""Live reward health: windows, fleet merge, and "sharply" (quiet on a steady run, loud on a jump)."""

from __future__ import annotations

import random

from rewardq.consumers.reward_health import RewardHealth, Window, judge, jumps, merge


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def feed(
    h: RewardHealth, clock: Clock, seconds: float, rate: float, p_ok: float, p_err: float, rng: random.Random
) -> None:
    """``rate`` trajectories per second of one data source for ``seconds``: rewards 1 with
    probability ``p_ok`` (else 0), an error with probability ``p_err``."""
    for _ in range(int(seconds * rate)):
        clock.t += 1 / rate
        if rng.random() < p_err:
            h.record("gsm8k", reward=None, failure_kind="scorer", latency_ms=rng.uniform(5, 50))
        else:
            h.record("gsm8k", reward=float(rng.random() < p_ok), failure_kind=None, latency_ms=rng.uniform(5, 50))


def test_a_steady_run_is_quiet() -> None:
    rng = random.Random(0)
    quiet = 0
    for _ in range(200):  # 200 independent steady runs, each judged at its end
        clock = Clock()
        h = RewardHealth(clock)
        feed(h, clock, 660, rate=2.0, p_ok=0.6, p_err=0.05, rng=rng)
        quiet += not judge(h.windows())[0]["jumps"]
    assert quiet == 200


def test_a_sharp_drop_of_the_reward_or_rise_of_errors_is_flagged() -> None:
    rng = random.Random(1)
    clock = Clock()
    h = RewardHealth(clock)
    feed(h, clock, 600, rate=2.0, p_ok=0.6, p_err=0.0, rng=rng)
    feed(h, clock, 60, rate=2.0, p_ok=0.1, p_err=0.0, rng=rng)  # the scorer broke: rewards collapse
    [row] = judge(h.windows())
    assert row["jumps"] and row["jumps"][0].startswith("mean reward 0.")
    clock2 = Clock()
    h2 = RewardHealth(clock2)
    feed(h2, clock2, 600, rate=2.0, p_ok=0.6, p_err=0.02, rng=rng)
    feed(h2, clock2, 60, rate=2.0, p_ok=0.6, p_err=0.5, rng=rng)  # the judge is down: errors
    [row2] = judge(h2.windows())
    assert any(j.startswith("error share") and "scorer" in j for j in row2["jumps"])
    assert row2["errors_by_kind"]["scorer"] > 0.3 and row2["p99_ms"] is not None and row2["p99_ms"] >= 40


def test_too_few_trajectories_are_never_judged() -> None:
    recent, base = Window(n=10, scored=10, total=0.0), Window(n=500, scored=500, total=500.0, squares=500.0)
    assert jumps(recent, base) == []


def test_workers_windows_add_up_to_the_fleets() -> None:
    rng = random.Random(2)
    clock = Clock()
    a, b, both = RewardHealth(clock), RewardHealth(clock), RewardHealth(clock)
    for _ in range(300):
        clock.t += 0.5
        reward = float(rng.random() < 0.5)
        (a if rng.random() < 0.5 else b).record("x", reward=reward, failure_kind=None, latency_ms=10.0)
        both.record("x", reward=reward, failure_kind=None, latency_ms=10.0)
    merged = merge([a.snapshot(), b.snapshot()])["x"]
    alone = both.windows()["x"]
    assert merged[0].as_dict() == alone[0].as_dict() and merged[1].as_dict() == alone[1].as_dict()
