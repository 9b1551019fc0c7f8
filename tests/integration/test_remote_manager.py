"""The ``remote`` manager: scoring in real separate processes, killed on timeout, replaced on crash."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tensordict import TensorDict

from rewardq.consumers.batch import build_batch
from rewardq.errors import ConfigError, ScoringError, ScoringTimeout
from rewardq.queue.states import FailureKind, failure_kind_of
from rewardq.reward.managers.remote import RemoteRewardManager
from tests.support import remote_scorers
from tests.support.checks import must, single
from tests.support.isolation import REMOTE_SCORERS, alive
from tests.support.managers import MakeManager, set_up_managers
from tests.support.records import TOK, record


def trajectory(
    response: str,
    ground_truth: str = "1",
    *,
    data_source: str = "test",
    extra_info: dict[str, Any] | None = None,
    n: int = 1,
) -> TensorDict:
    sample = {
        "data_source": data_source,
        "reward_model": {"ground_truth": ground_truth},
        "extra_info": dict(extra_info or {"split": "test"}),
    }
    return build_batch(
        [
            record(
                i,
                response if i == n - 1 else f"turn {i}",
                final=i == n - 1,
                sample=sample,
                prompt="What is it?",
                num_turns=2 * (i + 1),
                extra_fields={"tool_calls": i + 1, "turn": f"t{i}"},
                reward_score=0.25 if i == n - 1 else None,
            )
            for i in range(n)
        ]
    )


@pytest.fixture
async def managers() -> AsyncIterator[MakeManager[RemoteRewardManager]]:
    async with set_up_managers(lambda **kw: RemoteRewardManager(TOK, **kw)) as make:
        yield make


async def test_hung_scorer_is_killed_and_replaced_while_another_sample_scores(
    managers: MakeManager[RemoteRewardManager],
) -> None:
    m = await managers(scorer_spec=f"{REMOTE_SCORERS}:by_behaviour", num_workers=2, timeout=2.0)
    pids_before = list(m.pool.pids)
    t0 = time.monotonic()
    finished: dict[str, float] = {}

    async def timed(name: str, response: str) -> object:
        try:
            return await m.run_single(trajectory(response))
        except ScoringError as exc:
            return exc
        finally:
            finished[name] = time.monotonic() - t0

    hung, fine = await asyncio.gather(timed("hung", "hang"), timed("fine", "sleep:0.2"))
    # a timeout is never a reward: a ScoringTimeout (kind timeout) carrying verl's extra info
    assert isinstance(hung, ScoringTimeout) and failure_kind_of(hung) is FailureKind.TIMEOUT
    assert hung.extra_info == {"timeout": True, "acc": 0.0} and "timed out after 2s" in str(hung)
    assert fine == {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}
    assert finished["fine"] < 2.0 <= finished["hung"] < 10.0  # unaffected by the hung one
    # exactly one process was replaced; the hung one is gone
    pids_after = list(m.pool.pids)
    replaced = [p for p in pids_before if p not in pids_after]
    assert len(replaced) == 1 and not alive(must(replaced[0]))
    assert len(set(pids_after)) == 2 and all(alive(must(p)) for p in pids_after)
    assert m.stats()["timeouts"] == 1 and m.stats()["replaced"] == 1
    # the pool is whole again once the replacement has loaded: two 1 s samples run side by side
    deadline = time.monotonic() + 20
    while not all(s.ready for s in m.pool._slots) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    t1 = time.monotonic()
    again = await asyncio.gather(*(m.run_single(trajectory("sleep:1.0")) for _ in range(2)))
    assert [r["reward_score"] for r in again] == [1.0, 1.0]
    assert time.monotonic() - t1 < 1.9  # one after the other: >= 2 s


async def test_crashing_scorer_gives_an_error_result_and_a_new_process(
    managers: MakeManager[RemoteRewardManager],
) -> None:
    m = await managers(scorer_spec=f"{REMOTE_SCORERS}:by_behaviour", num_workers=1, timeout=10.0)
    first_pid = m.pool.pids[0]
    with pytest.raises(ScoringError) as seg:  # a crash is never a reward: kind scorer, verl's acc kept
        await m.run_single(trajectory("segfault"))
    assert failure_kind_of(seg.value) is FailureKind.SCORER and seg.value.extra_info == {"acc": 0.0}
    assert "SIGSEGV" in str(seg.value) and str(first_pid) in str(seg.value)
    second_pid = m.pool.pids[0]
    assert second_pid != first_pid and not alive(must(first_pid))
    with pytest.raises(ScoringError, match="exited with code 3"):
        await m.run_single(trajectory("exit"))
    assert (await m.run_single(trajectory("ok")))["reward_score"] == 1.0
    assert m.stats()["crashes"] == 2 and m.stats()["replaced"] == 2


async def test_an_exception_in_the_scorer_raises_and_keeps_the_process(
    managers: MakeManager[RemoteRewardManager],
) -> None:
    m = await managers(scorer_spec=f"{REMOTE_SCORERS}:by_behaviour", num_workers=1)
    pid = m.pool.pids[0]
    with pytest.raises(ScoringError, match="ValueError: scorer refused this answer"):
        await m.run_single(trajectory("raise"))
    assert m.pool.pids == [pid]
    assert (await m.run_single(trajectory("ok")))["reward_score"] == 1.0


def test_async_scoring_functions_are_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match="async scoring function"):
        RemoteRewardManager(TOK, remote_scorers.async_score)
    with pytest.raises(ConfigError, match="async scoring function"):
        RemoteRewardManager(TOK, scorer_spec=f"{REMOTE_SCORERS}:async_score")


def test_unusable_targets_and_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="define it at module level"):
        RemoteRewardManager(TOK, lambda **kw: 1.0)
    with pytest.raises(ConfigError, match="no_such_fn"):
        RemoteRewardManager(TOK, scorer_spec=f"{REMOTE_SCORERS}:no_such_fn")
    with pytest.raises(ConfigError, match="start_method"):
        RemoteRewardManager(TOK, start_method="fork")
    with pytest.raises(ConfigError, match="timeout"):
        RemoteRewardManager(TOK, timeout=0)
    with pytest.raises(ConfigError, match="not both"):
        RemoteRewardManager(TOK, scorer="math_verify", scorer_spec=f"{REMOTE_SCORERS}:compute_score")


async def test_function_by_reference_with_kwargs_and_the_extras(managers: MakeManager[RemoteRewardManager]) -> None:
    fn = functools.partial(remote_scorers.compute_score, bonus=0.5)
    m = await managers(compute_score=fn, num_workers=1, start_method="spawn")
    assert m.target == "tests.support.remote_scorers:compute_score" and m.target_kwargs == {"bonus": 0.5}
    data = trajectory("42", "42", extra_info={"split": "test", "turn": "from-dataset"}, n=2)
    dataset_extra = data[-1]["extra_info"]
    out = await m.run_single(data)
    assert out["reward_score"] == 1.5
    info = out["reward_extra_info"]
    assert info["pid"] != os.getpid()
    assert info["seen_extra"] == {
        "split": "test",
        "turn": "t1",
        "tool_calls": 2,
        "num_turns": 4,
        "rollout_reward_scores": {"reward_score": 0.25},
    }
    assert dataset_extra == {"split": "test", "turn": "from-dataset"}  # merged into a copy


async def test_math_verify_equivalence_through_the_pool(managers: MakeManager[RemoteRewardManager]) -> None:
    m = await managers(scorer="math_verify", num_workers=2, timeout=30.0)
    half, third = await asyncio.gather(
        m.run_single(trajectory(r"The answer is \boxed{1/2}", "0.5", data_source="anything")),
        m.run_single(trajectory(r"The answer is \boxed{1/3}", "0.5", data_source="anything")),
    )
    assert half == {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}
    assert third == {"reward_score": 0.0, "reward_extra_info": {"acc": 0.0}}
    # the reason for the processes: in a thread, math-verify's signal.alarm timeouts cannot work
    from rewardq.reward.scoring.math_verify_scorer import compute_score

    loop = asyncio.get_running_loop()
    with pytest.raises(ScoringError, match="main thread"):
        await loop.run_in_executor(None, functools.partial(compute_score, "x", r"\boxed{1/2}", "0.5"))


async def test_a_warm_up_longer_than_the_timeout_counts_against_no_call(
    managers: MakeManager[RemoteRewardManager],
) -> None:
    # Given a scoring function whose warm-up (a 3 s import) takes longer than the 2 s call timeout
    m = await managers(compute_score=remote_scorers.slow_to_warm, num_workers=2, timeout=2.0)
    # When the first calls come to its new processes
    outs = await asyncio.gather(*(m.run_single(trajectory("42", "42")) for _ in range(4)))
    # Then each process warmed up before it took a call, and no call timed out
    assert [o["reward_score"] for o in outs] == [1.0] * 4
    assert all(o["reward_extra_info"]["warmed"] is True for o in outs), outs


async def test_built_by_the_factory_from_a_reward_fn_spec_with_kwargs() -> None:
    from rewardq.reward.execution.loader import load_score_fn
    from rewardq.reward.factory import build_manager

    spec = f"{REMOTE_SCORERS}:compute_score"
    m = build_manager(
        "remote",
        tokenizer=TOK,
        compute_score=load_score_fn(spec, {"bonus": 2.0}),
        options={"scorer_spec": spec, "num_workers": 1, "timeout": 10},
    )
    try:
        await m.setup()
        out = single(await m.run_single(trajectory("7", "7")))
        assert out["reward_score"] == 3.0 and out["reward_extra_info"]["pid"] != os.getpid()
        assert isinstance(m, RemoteRewardManager)
        assert m.target == spec and m.target_kwargs == {"bonus": 2.0}
    finally:
        await m.close()


async def test_an_unpicklable_sample_is_refused_without_losing_the_process(
    managers: MakeManager[RemoteRewardManager],
) -> None:
    m = await managers(scorer_spec=f"{REMOTE_SCORERS}:by_behaviour", num_workers=1)
    with pytest.raises(ScoringError, match="cannot send the sample"):
        await m.pool.run(
            {"solution_str": "ok", "data_source": "x", "ground_truth": "1", "extra_info": {"handle": threading.Lock()}},
            5,
        )
    assert (await m.run_single(trajectory("ok")))["reward_score"] == 1.0


def test_a_function_loaded_from_a_file_is_sent_by_path() -> None:
    from rewardq.reward.execution.loader import load_score_fn

    fn = load_score_fn(f"{REMOTE_SCORERS}:compute_score", {"bonus": 1.0})
    m = RemoteRewardManager(TOK, fn)  # no spec: derived from the function
    assert m.target == f"{os.path.realpath(REMOTE_SCORERS)}:compute_score" and m.target_kwargs == {"bonus": 1.0}
