"""Where scoring functions run (rewardq.reward.execution.isolation) and what their failures become.

Real scorer processes and threads, no Redis: each test asserts the exact reason a
misbehaving function's trajectory gets, and that the next call is scored normally.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from tensordict import TensorDict

from rewardq.consumers.scorer import TrajectoryScorer
from rewardq.errors import ScoringError
from rewardq.queue.codec import OutputRecord
from rewardq.reward import scoring
from rewardq.reward.base import RewardManager
from rewardq.reward.execution.isolation import _Threads
from rewardq.reward.managers.naive import NaiveRewardManager
from tests.support import misbehaving
from tests.support.helpers import until
from tests.support.isolation import trajectory

# -- placement ---------------------------------------------------------------------------------


async def test_builtin_inline_scorer_stays_in_the_event_loop(naive: Callable[..., NaiveRewardManager]) -> None:
    m = naive(None)
    out = await m.run_single(trajectory("#### 72", "72", data_source="openai/gsm8k"))
    assert out == {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}
    assert m.host.router._builtin is None  # no scorer process was started


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
