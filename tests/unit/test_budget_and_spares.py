"""A trajectory's budget stops while it waits for a place; when a busy scorer process counts as stuck."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from types import SimpleNamespace
from typing import cast

import pytest

from rewardq.reward.execution.budget import ScoringBudget, current_budget, run_within_budget, waiting_for_a_place
from rewardq.reward.execution.scorer_slot import ScorerSlot
from rewardq.reward.execution.spares import SparePolicy, cpu_seconds

BOTH_WAYS = pytest.mark.parametrize("own_task", [False, True], ids=["in-task", "own-task (3.10)"])


@BOTH_WAYS
async def test_time_spent_waiting_for_a_place_is_not_spent_from_the_budget(own_task: bool) -> None:
    async def queued_then_quick() -> ScoringBudget | None:
        with waiting_for_a_place():
            await asyncio.sleep(1.0)  # twice the budget, all of it waiting
        await asyncio.sleep(0.01)
        return current_budget()

    budget = await run_within_budget(queued_then_quick(), 0.5, own_task=own_task)
    assert budget is not None and budget.waited >= 1.0 and budget.remaining() > 0


@BOTH_WAYS
async def test_the_budget_still_ends_work_that_runs_too_long(own_task: bool) -> None:
    async def runs_on() -> None:
        with waiting_for_a_place():
            await asyncio.sleep(0.05)
        await asyncio.sleep(30)

    with pytest.raises(asyncio.TimeoutError):
        await run_within_budget(runs_on(), 0.3, own_task=own_task)


@BOTH_WAYS
async def test_calls_waiting_together_stop_the_clock_once(own_task: bool) -> None:
    async def row(wait: float) -> None:
        with waiting_for_a_place():
            await asyncio.sleep(wait)

    async def rows() -> ScoringBudget | None:
        await asyncio.gather(row(0.4), row(0.4), row(0.2))  # tasks of their own share the budget
        return current_budget()

    budget = await run_within_budget(rows(), 5.0, own_task=own_task)
    assert budget is not None and 0.4 <= budget.waited < 0.8  # the overlap counted once, not 1.0 s


async def test_outside_a_trajectory_waiting_changes_nothing() -> None:
    with waiting_for_a_place() as budget:
        assert budget is None


def policy(cpu: dict[int, float]) -> SparePolicy:
    return SparePolicy(after=2.0, most=2, cpu_of=lambda pid: cpu.get(pid) if pid is not None else None)


def test_the_threshold_is_spare_after_or_a_quarter_of_a_short_budget() -> None:
    p = policy({})
    assert p.threshold(None) == 2.0
    assert p.threshold(300.0) == 2.0
    assert p.threshold(2.0) == 0.5  # --score-timeout 2: a spare is due well before the budget is at risk
    assert SparePolicy(after=None).threshold(2.0) is None


def busy_slot(pid: int, threshold: float) -> ScorerSlot:
    """What the policy reads of a busy slot: busy since 0 on a call with ``threshold``."""
    slot = SimpleNamespace(pid=pid, busy_since=0.0, threshold=threshold, cpu_mark=None, stuck_seen=False, dead=False)
    return cast(ScorerSlot, slot)


def test_a_process_counts_as_stuck_only_when_it_sleeps_or_spins_past_its_threshold() -> None:
    cpu = {1: 10.0, 2: 10.0, 3: 10.0}
    p = policy(cpu)
    sleeper, slow, spinner = busy_slot(1, 2.0), busy_slot(2, 2.0), busy_slot(3, 2.0)
    for s in (sleeper, slow, spinner):
        assert not p.slot_stuck(s, 1.0)  # not yet at its threshold: no /proc read either
        assert not p.slot_stuck(s, 2.0)  # the first look past it notes the CPU time
    cpu.update({1: 10.0, 2: 10.1, 3: 10.5})  # half a second later
    # sleeping or waiting on something: no CPU -> a hang
    assert p.slot_stuck(sleeper, 2.5)
    # computing, but at a fifth of a core (waiting for one on a loaded machine): counted, no spare
    assert not p.slot_stuck(slow, 2.5)
    # spinning: a whole core, which over the call comes to more than the threshold
    assert p.slot_stuck(spinner, 2.5)
    # a look too soon after the last keeps the verdict
    assert p.slot_stuck(sleeper, 2.55) and not p.slot_stuck(slow, 2.55)
    # without /proc, wall time alone decides
    assert p.slot_stuck(busy_slot(4, 2.0), 2.5)
    assert p.able([sleeper, slow, spinner], 2.6) == 1


def test_cpu_seconds_reads_this_process_and_nothing_for_a_missing_one() -> None:

    before = cpu_seconds(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    after = cpu_seconds(os.getpid())
    assert before is not None and after is not None and after > before
    assert cpu_seconds(2**22 + 12345) is None and cpu_seconds(None) is None


async def test_a_call_waiting_for_a_scoring_thread_does_not_spend_its_budget() -> None:
    from rewardq.reward.execution.threads import ThreadRunner

    release = threading.Event()
    runner = ThreadRunner(lambda wait: (release.wait(wait), "done")[1], size=1, max_lost=4)
    holder = asyncio.create_task(runner.call({"wait": 5.0}))  # takes the only thread
    await asyncio.sleep(0.05)
    # the second call waits behind it for longer than its own budget, then runs at once
    asyncio.get_running_loop().call_later(0.6, release.set)
    assert await run_within_budget(runner.call({"wait": 0.0}), 0.3) == "done"
    assert await holder == "done"
