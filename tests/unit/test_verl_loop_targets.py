"""The targets ``python -m benchmarks.verl_loop`` prints are issue 31's goals, judged unrounded."""

from __future__ import annotations

from typing import Any

from benchmarks.verl_loop.report import targets


def _row(system: str, scorer: str, phase: str, wall: float, cpu: float, p99: float = 0.0) -> dict[str, Any]:
    return {
        "system": system,
        "scorer": scorer,
        "phase": phase,
        "size": 2,
        "round": 1,
        "trajectories": 1000,
        "wall_s": wall,
        "cpu_s": {"scorers": cpu, "redis": 0.0, "producer": 0.1},
        "p50_ms": p99 / 2,
        "p99_ms": p99,
    }


def _run(rewardq_gsm8k_wall: float) -> list[dict[str, Any]]:
    return [
        _row("verl", "gsm8k", "burst", 10.0, 20.0),
        _row("rewardq", "gsm8k", "burst", rewardq_gsm8k_wall, 4.0),
        _row("verl", "math_verify", "burst", 20.0, 40.0),
        _row("rewardq", "math_verify", "burst", 7.0, 10.0),
        _row("verl", "gsm8k", "steady", 10.0, 1.0, p99=100.0),
        _row("rewardq", "gsm8k", "steady", 10.0, 1.0, p99=15.0),
        _row("verl", "math_verify", "steady", 10.0, 1.0, p99=100.0),
        _row("rewardq", "math_verify", "steady", 10.0, 1.0, p99=30.0),
    ]


def test_the_goals_are_the_issues_and_a_near_miss_is_shown_as_one() -> None:
    base = {"math_verify": {"function_cpu_s": 6.0, "calls": 1000, "wall_s": 3.0, "processes": 2}}
    got = {t["name"]: t for t in targets(_run(2.534), base, reward_cores=1)}
    wall = got["GSM8K burst wall, 2 workers vs 2 actors"]
    assert (wall["goal"], wall["measured"], wall["verdict"]) == ("≤ 0.25× verl", "0.253×", "MISS")
    assert got["GSM8K burst CPU per trajectory (all groups)"]["goal"] == "≤ 0.2× verl"
    assert got["math-verify burst CPU per trajectory (all groups)"]["verdict"] == "MISS"  # 10.1 / 40.1
    assert got["GSM8K steady p99"]["verdict"] == "PASS" and got["math-verify steady p99"]["verdict"] == "MISS"
    mv = got["math-verify burst wall vs verl"]
    assert (mv["goal"], mv["measured"], mv["verdict"]) == ("≤ 0.4× verl", "0.350×", "PASS")
    # pinned: the function's 6 s of CPU on the reward side's one core against a 7 s burst
    own = got["math-verify burst wall vs the function's own CPU on the reward side's 1 core(s)"]
    assert (own["goal"], own["measured"], own["verdict"]) == ("≤ 1.2×", "1.167×", "PASS")
    # ... and the executor's 333 calls/s on 2 processes count as 167/s on that one core: 1000 / 7 s
    pool = got["math-verify throughput vs a bare ProcessPoolExecutor on 1 core(s)"]
    assert (pool["measured"], pool["verdict"]) == ("0.857×", "MISS")
    unpinned = {t["name"]: t for t in targets(_run(2.4), base, reward_cores=None)}
    assert unpinned["GSM8K burst wall, 2 workers vs 2 actors"]["verdict"] == "PASS"
