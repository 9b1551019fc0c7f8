"""ScoringGate: ordinary trajectories side by side, a quarantined one alone, fewest deaths first."""

from __future__ import annotations

import asyncio

import pytest

from rewardq.consumers.quarantine import ScoringGate


async def test_shared_entries_do_not_wait_for_each_other() -> None:
    gate = ScoringGate()
    await asyncio.wait_for(asyncio.gather(*(gate.enter_shared() for _ in range(5))), 1)
    assert gate.running == 5


async def test_alone_waits_for_running_ones_and_holds_new_ones_back() -> None:
    gate = ScoringGate()
    order: list[str] = []
    await gate.enter_shared()  # one ordinary trajectory is scoring

    async def alone() -> None:
        await gate.enter_alone(0)
        order.append("alone")
        await asyncio.sleep(0.05)
        order.append("alone done")
        gate.leave_alone()

    async def later() -> None:
        await gate.enter_shared()
        order.append("later")
        gate.leave_shared()

    quarantined = asyncio.create_task(alone())
    await asyncio.sleep(0.02)
    newcomer = asyncio.create_task(later())  # arrives while the quarantined one waits
    await asyncio.sleep(0.02)
    assert order == [] and not gate.alone  # both wait: the first ordinary one still runs
    gate.leave_shared()
    await asyncio.wait_for(asyncio.gather(quarantined, newcomer), 1)
    assert order == ["alone", "alone done", "later"]


async def test_quarantined_ones_go_fewest_earlier_deaths_first_then_by_arrival() -> None:
    gate = ScoringGate()
    order: list[str] = []

    async def alone(name: str, deaths: int) -> None:
        await gate.enter_alone(deaths)
        order.append(name)
        await asyncio.sleep(0)
        gate.leave_alone()

    # all queued in the same turn of the loop (as a batch of redeliveries is)
    tasks = [asyncio.create_task(alone(n, d)) for n, d in [("suspect", 1), ("a", 0), ("worst", 2), ("b", 0)]]
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert order == ["a", "b", "suspect", "worst"]


async def test_a_cancelled_waiter_lets_the_next_one_in() -> None:
    gate = ScoringGate()
    await gate.enter_shared()
    first = asyncio.create_task(gate.enter_alone(0))
    second = asyncio.create_task(gate.enter_alone(1))
    await asyncio.sleep(0.01)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    gate.leave_shared()
    await asyncio.wait_for(second, 1)
    assert gate.alone
