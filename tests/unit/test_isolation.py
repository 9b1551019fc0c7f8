"""Where scoring functions run (rewardq.reward.execution.isolation) and what their failures become.

Real scorer processes and threads, no Redis: each test asserts the exact reason a
misbehaving function's trajectory gets, and that the next call is scored normally.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from tensordict import TensorDict

from rewardq.consumers.scorer import TrajectoryScorer
from rewardq.errors import RemoteTraceback, ScoringError
from rewardq.queue.codec import OutputRecord
from rewardq.reward import scoring
from rewardq.reward.base import RewardManager
from rewardq.reward.execution.isolation import _Processes, _Threads
from rewardq.reward.execution.loader import load_score_fn
from rewardq.reward.managers.naive import NaiveRewardManager
from tests.support import misbehaving
from tests.support.checks import must
from tests.support.helpers import until
from tests.support.isolation import REMOTE_SCORERS, alive, trajectory

# -- placement ---------------------------------------------------------------------------------


async def test_builtin_inline_scorer_stays_in_the_event_loop(naive: Callable[..., NaiveRewardManager]) -> None:
    m = naive(None)
    out = await m.run_single(trajectory("#### 72", "72", data_source="openai/gsm8k"))
    assert out == {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}
    assert m.host.router._builtin is None  # no scorer process was started


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


async def test_builtin_async_scorer_is_awaited(
    naive: Callable[..., NaiveRewardManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []

    async def judge(solution_str: str, ground_truth: Any, **_: Any) -> float:
        await asyncio.sleep(0)
        seen.append(threading.current_thread())
        return 0.5

    judge.placement = "async"  # type: ignore[attr-defined]  # how a scorer declares where it runs
    monkeypatch.setitem(scoring.EXACT_SCORERS, "test/async-judge", judge)
    m = naive(None)
    assert (await m.run_single(trajectory("x", data_source="test/async-judge")))["reward_score"] == 0.5
    assert seen == [threading.main_thread()] and m.host.router._builtin is None


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


async def test_a_closure_runs_in_threads_and_says_so_at_start_up(
    naive: Callable[..., NaiveRewardManager], caplog: pytest.LogCaptureFixture
) -> None:
    def closure(**kw: Any) -> bool:
        return threading.current_thread().name.startswith("rewardq-score")

    m = naive(closure)
    with caplog.at_level(logging.WARNING, logger="rewardq.reward"):
        await m.prepare_scoring()
        assert (await m.run_single(trajectory("x")))["reward_score"] == 1.0
    text = caplog.text
    assert "cannot be loaded by name in a scorer process" in text and "threads of the worker" in text


# -- what a sync function's misbehaviour becomes (scorer processes) ------------------------------


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


# -- threads and in-process code ----------------------------------------------------------------


async def test_hung_thread_calls_are_replaced_then_refused_past_the_bound(
    naive: Callable[..., NaiveRewardManager],
) -> None:
    release = threading.Event()

    def stuck(**kw: Any) -> float:
        release.wait()
        return 1.0

    m = naive(stuck, processes=2, max_lost_threads=5)  # 4 threads at once
    for _ in range(5):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(m.run_single(trajectory("x")), 0.2)
    place = m.host.router.place_of(stuck)
    assert isinstance(place, _Threads)
    runner = place.runner
    assert runner.lost == 5 and runner.counters["calls"] == 5  # each hung call had a fresh thread
    with pytest.raises(ScoringError, match="5 earlier calls .* never returned"):
        await m.run_single(trajectory("x"))
    release.set()
    await until(lambda: runner.lost == 0, "the released threads to be counted back", 5.0, poll=0.01)
    assert runner.lost == 0 and (await m.run_single(trajectory("x")))["reward_score"] == 1.0
    lost_threads = [t for t in threading.enumerate() if t.name.startswith("rewardq-score")]
    assert all(t.daemon for t in lost_threads)


@pytest.mark.parametrize("fn", ["thread", "inline", "async"])
@pytest.mark.parametrize(
    "response, reason",
    [
        ("sysexit:4", "the reward function called sys.exit(4)"),
        ("interrupt", "the reward function raised KeyboardInterrupt"),
    ],
)
async def test_exit_and_interrupt_in_process_are_scoring_errors(
    naive: Callable[..., NaiveRewardManager], fn: str, response: str, reason: str
) -> None:
    if fn == "async":
        m = naive(misbehaving.misbehave_async)
    else:
        m = naive(misbehaving.misbehave, reward_fn_placement=fn)
    with pytest.raises(ScoringError) as info:
        await m.run_single(trajectory(response))
    assert str(info.value) == reason
    assert (await m.run_single(trajectory("ok")))["reward_score"] == 1.0


class Quits(RewardManager):
    def __init__(self, escape: BaseException) -> None:
        super().__init__(None)
        self.escape = escape

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        await asyncio.sleep(0)
        raise self.escape


@pytest.mark.parametrize(
    "escape, reason",
    [
        (SystemExit(5), "the reward manager's run_single called sys.exit(5)"),
        (SystemExit(), "the reward manager's run_single called sys.exit()"),
        (KeyboardInterrupt(), "the reward manager's run_single raised KeyboardInterrupt"),
    ],
)
async def test_exit_and_interrupt_in_a_custom_manager_are_scoring_errors(escape: Any, reason: str) -> None:
    scorer = TrajectoryScorer(Quits(escape), manager_name="quits", worker_name="w", timeout=5)
    record = OutputRecord(
        uid="u", session_id="s", index=0, final=True, prompt_ids=np.array([1]), response_ids=np.array([2])
    )
    with pytest.raises(ScoringError) as info:
        await scorer.score([record])
    assert str(info.value) == reason


async def test_the_cost_benchmark_measures_every_placement() -> None:
    from benchmarks.isolation import PLACEMENTS, per_call

    for placement in PLACEMENTS:
        m = await per_call(placement, 64)
        assert m["sequential_us"] > 0 and m["concurrent_cpu_us"] > 0, (placement, m)
