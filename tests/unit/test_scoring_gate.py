"""ScoringGate: ordinary trajectories side by side, quarantined ones in cohorts within every member's
limit (alone at limit 1), fewest deaths first."""

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
    assert order == [] and not gate.cohort  # both wait: the first ordinary one still runs
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
    assert gate.cohort


async def test_a_cohort_takes_the_waiting_suspects_within_every_members_limit_and_nothing_joins_it() -> None:
    gate = ScoringGate()
    sizes: dict[str, int] = {}
    together: list[set[str]] = []
    running: set[str] = set()

    async def suspect(name: str, limit: int, deaths: int = 0) -> None:
        sizes[name] = await gate.enter_alone(deaths, limit)
        running.add(name)
        together.append(set(running))
        await asyncio.sleep(0.02)
        running.discard(name)
        gate.leave_alone()

    # Given suspects queued in one turn of the loop: three that may share a cohort of up to 4,
    # two of up to 2, and one that must be alone (it died alone before)
    specs = [("a", 4), ("b", 4), ("c", 4), ("d", 2), ("e", 2)]
    tasks = [asyncio.create_task(suspect(n, lim)) for n, lim in specs]
    tasks.append(asyncio.create_task(suspect("killer", 1, deaths=1)))
    late: asyncio.Task[None] | None = None

    async def arrive_late() -> None:
        await asyncio.sleep(0.005)
        await suspect("late", 4)

    late = asyncio.create_task(arrive_late())
    await asyncio.wait_for(asyncio.gather(*tasks, late), 2)
    # Then the first cohort holds a, b, c (within 4; d would bring it past d's own limit of 2, so
    # it is not added), the late one never joins a running cohort, and the one at limit 1 is alone
    assert sizes["a"] == sizes["b"] == sizes["c"] == 3 and sizes["killer"] == 1
    assert max(len(s) for s in together) == 3 and sizes["d"] == sizes["e"] == 2
    assert {"a", "b", "c"} in together and not any("late" in s and len(s) > sizes["late"] for s in together)
    assert not any("killer" in s and len(s) > 1 for s in together)
    assert gate.cohort == 0 and gate.running == 0
