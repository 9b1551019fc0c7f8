"""Scoring functions placed in scorer processes: where they run and what their failures become."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from rewardq.errors import RemoteTraceback, ScoringError
from rewardq.reward import scoring
from rewardq.reward.execution.isolation import _Processes
from rewardq.reward.execution.loader import load_score_fn
from rewardq.reward.managers.naive import NaiveRewardManager
from tests.support import misbehaving
from tests.support.checks import must
from tests.support.isolation import REMOTE_SCORERS, alive, trajectory


async def test_builtin_process_scorer_runs_in_a_scorer_process(
    naive: Callable[..., NaiveRewardManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scoring, "placement_of", lambda data_source: "process")
    m = naive(None, processes=1)
    out = await m.run_single(trajectory("#### 72", "72", data_source="openai/gsm8k"))
    assert out["reward_score"] == 1.0
    assert m.host.router._builtin is not None
    pool = m.host.router._builtin.pool
    assert pool.counters["tasks"] == 1 and pool.target == "rewardq.reward.scoring:default_compute_score"
    assert all(pid != os.getpid() and alive(must(pid)) for pid in pool.pids)


@pytest.mark.parametrize(
    "placement, in_child, thread",
    [("process", True, "MainThread"), ("thread", False, "rewardq-score-1"), ("inline", False, "MainThread")],
)
async def test_sync_function_runs_where_its_placement_says(
    naive: Callable[..., NaiveRewardManager], placement: str, in_child: bool, thread: str
) -> None:
    m = naive(misbehaving.where, reward_fn_placement=placement, processes=1)
    info = (await m.run_single(trajectory("ok")))["reward_extra_info"]
    assert (info["pid"] != os.getpid()) is in_child and info["thread"] == thread


async def test_reward_fn_spec_is_what_the_scorer_process_loads_with_its_kwargs(
    naive: Callable[..., NaiveRewardManager],
) -> None:
    spec = f"{REMOTE_SCORERS}:compute_score"
    fn = load_score_fn(spec, {"bonus": 2.0})
    m = naive(fn, reward_fn=spec, reward_fn_kwargs={"bonus": 2.0}, processes=1)
    out = await m.run_single(trajectory("7", "7"))
    assert out["reward_score"] == 3.0 and out["reward_extra_info"]["pid"] != os.getpid()
    place = m.host.router.place_of(must(fn))
    assert isinstance(place, _Processes) and place.pool.target == spec


async def test_exits_interrupts_and_crashes_end_only_their_trajectory(naive: Callable[..., NaiveRewardManager]) -> None:
    m = naive(misbehaving.misbehave, processes=1)
    cases = {
        "sysexit:3": r"^the reward function called sys\.exit\(3\)$",
        "interrupt": r"^the reward function raised KeyboardInterrupt$",
        "exit:7": r"^the reward function's process \(pid \d+\) exited with code 7 while scoring "
        r"\(os\._exit, or a fatal error in native code\?\)$",
        "segfault": r"^the reward function's process \(pid \d+\) killed by SIGSEGV while scoring "
        r"\(a crash in native code\)$",
    }
    for response, reason in cases.items():
        with pytest.raises(ScoringError, match=reason):
            await m.run_single(trajectory(response))
        assert (await m.run_single(trajectory("ok")))["reward_score"] == 1.0, f"after {response}"
    place = m.host.router.place_of(misbehaving.misbehave)
    assert isinstance(place, _Processes)
    counters = place.pool.counters
    assert counters["crashes"] == 2 and counters["errors"] == 2 and counters["replaced"] == 2


async def test_an_exception_keeps_its_type_message_and_the_child_traceback(
    naive: Callable[..., NaiveRewardManager],
) -> None:
    m = naive(misbehaving.misbehave, processes=1)
    with pytest.raises(ScoringError, match="^ValueError: this answer is refused on purpose$") as info:
        await m.run_single(trajectory("raise"))
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback) and "misbehaving.py" in cause.text and "_act" in cause.text


async def test_the_cost_benchmark_measures_every_placement() -> None:
    from benchmarks.isolation import PLACEMENTS, per_call

    for placement in PLACEMENTS:
        m = await per_call(placement, 64)
        assert m["sequential_us"] > 0 and m["concurrent_cpu_us"] > 0, (placement, m)
