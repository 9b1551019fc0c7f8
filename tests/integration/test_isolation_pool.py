"""Scorer processes under load: hung calls, a GIL holder, spare processes (real child processes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rewardq.reward.execution.isolation import _Processes
from rewardq.reward.execution.process_pool import ScorerPool
from rewardq.reward.managers.naive import NaiveRewardManager
from tests.support import misbehaving
from tests.support.checks import must
from tests.support.helpers import until
from tests.support.isolation import REMOTE_SCORERS, alive, trajectory


async def test_more_hung_calls_than_processes_never_hold_up_good_ones(naive: Callable[..., NaiveRewardManager]) -> None:
    """Four calls hang in a pool of two; good calls after them finish long before the hung
    ones time out (spares), and the hung processes are killed when their callers give up."""
    m = naive(misbehaving.misbehave, processes=2, spare_after=0.5, max_spares=8)
    await m.prepare_scoring()
    place = m.host.router.place_of(misbehaving.misbehave)
    assert isinstance(place, _Processes)
    pool = place.pool

    async def hung() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(m.run_single(trajectory("hang")), 8.0)

    async def good() -> float:
        t0 = time.monotonic()
        assert (await m.run_single(trajectory("ok")))["reward_score"] == 1.0
        return time.monotonic() - t0

    hangs = [asyncio.create_task(hung()) for _ in range(4)]
    await asyncio.sleep(0.2)
    busy = list(pool.pids)
    took = await asyncio.gather(*(good() for _ in range(4)))
    assert max(took) < 6.0, took  # a good call never waits for a hung one's timeout (8 s)
    await asyncio.gather(*hangs)
    await until(lambda: not any(alive(must(p)) for p in busy), "the hung processes to be killed")
    assert pool.counters["spares"] >= 2
    assert (await m.run_single(trajectory("ok")))["reward_score"] == 1.0


async def test_a_gil_holder_does_not_stall_its_neighbours(naive: Callable[..., NaiveRewardManager]) -> None:
    m = naive(misbehaving.misbehave, processes=2)
    await m.prepare_scoring()
    t0 = time.monotonic()
    ticks = []

    async def ticker() -> None:
        while time.monotonic() - t0 < 2.5:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.05)

    holder = asyncio.create_task(m.run_single(trajectory("gil:3")))
    await asyncio.sleep(0.2)
    tick = asyncio.create_task(ticker())
    neighbour = await m.run_single(trajectory("ok"))
    assert neighbour["reward_score"] == 1.0 and time.monotonic() - t0 < 2.5
    await tick
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < 1.0  # the event loop kept running
    assert (await holder)["reward_score"] == 0.0


async def test_spares_stay_within_their_bound(naive: Callable[..., NaiveRewardManager]) -> None:
    m = naive(misbehaving.misbehave, processes=1, spare_after=0.2, max_spares=1)
    await m.prepare_scoring()
    place = m.host.router.place_of(misbehaving.misbehave)
    assert isinstance(place, _Processes)
    pool = place.pool
    hung = [asyncio.create_task(m.run_single(trajectory("hang"))) for _ in range(3)]
    most = 0
    for _ in range(30):  # 1.5 s: long enough for several spare checks
        most = max(most, sum(1 for s in pool._slots if not s.dead))
        await asyncio.sleep(0.05)
    assert most == 2 and pool.counters["spares"] == 1  # one process plus at most one spare
    for task in hung:
        task.cancel()
    await asyncio.gather(*hung, return_exceptions=True)


async def _bursts(m: NaiveRewardManager, pool: ScorerPool, text: str, bursts: int, size: int, gap: float) -> int:
    """Run ``bursts`` bursts of ``size`` calls of ``text``, ``gap`` seconds apart; the most processes
    alive at once meanwhile."""
    most = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, sum(1 for s in pool._slots if not s.dead))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    for _ in range(bursts):
        results = await asyncio.gather(*(m.run_single(trajectory(text)) for _ in range(size)))
        assert {r["reward_score"] for r in results} == {0.0}  # each scored (the text is not the ground truth)
        await asyncio.sleep(gap)
    done.set()
    await watcher
    return most


async def test_a_long_but_legitimate_workload_never_starts_more_spares_than_the_bound(
    naive: Callable[..., NaiveRewardManager],
) -> None:
    """Calls slower than spare_after, in bursts with idle gaps: spares start once, up to the bound,
    and stay through the gaps (they exit only after spare_idle), instead of starting again each burst."""
    m = naive(misbehaving.misbehave, processes=1, spare_after=0.1, max_spares=2)
    await m.prepare_scoring()
    place = m.host.router.place_of(misbehaving.misbehave)
    assert isinstance(place, _Processes)
    pool = place.pool
    most = await _bursts(m, pool, "sleep:0.3", bursts=3, size=6, gap=0.5)
    print(f"\nspares started: {pool.counters['spares']}, most processes alive: {most}")
    assert pool.counters["spares"] <= 2 and most <= 3, (pool.counters, most)
    assert pool.counters["retired"] == 0  # none left during the gaps


# alone: the pool tells a computing call from a hung one by its share of a core, which other tests' work shrinks
@pytest.mark.alone
async def test_calls_that_compute_even_at_half_speed_start_no_spare(
    naive: Callable[..., NaiveRewardManager],
) -> None:
    """A call past spare_after that keeps computing (a process waiting for a core looks like this)
    is not stuck: the calls behind it wait for it, and no spare loads the machine further."""
    m = naive(misbehaving.misbehave, processes=1, spare_after=0.3, max_spares=2)
    await m.prepare_scoring()
    place = m.host.router.place_of(misbehaving.misbehave)
    assert isinstance(place, _Processes)
    pool = place.pool
    await _bursts(m, pool, "halfcore:0.5", bursts=1, size=4, gap=0.0)
    assert pool.counters["spares"] == 0, pool.counters


async def test_a_replacement_whose_warm_up_hangs_is_stopped_and_the_waiting_call_still_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a pool of one process (spawned: it sees this environment) whose function's warm-up will
    # hang in the next process started, and a 2 s ready deadline
    flag = tmp_path / "hang"
    monkeypatch.setenv("REMOTE_SCORERS_HANG_FLAG", str(flag))
    pool = ScorerPool(f"{REMOTE_SCORERS}:hangs_to_warm", num_workers=1, start_timeout=2.0, start_method="spawn")
    await pool.start()
    try:
        flag.touch()
        # When a call times out, so its process is replaced by one that hangs warming up
        slow = await pool.run({"solution_str": "sleep:60"}, timeout=1.0)
        assert slow.status == "timeout"
        # Then the next call is served anyway: the hung replacement is stopped at its deadline and
        # replaced by one that warms up
        t0 = time.monotonic()
        fast = await asyncio.wait_for(pool.run({"solution_str": "ok"}, timeout=30.0), 90)
        assert (fast.status, fast.value) == ("ok", 1.0), fast
        assert time.monotonic() - t0 >= 2.0  # it waited for the deadline, not for a call of its own
        assert not flag.exists() and pool.counters["replaced"] >= 2
    finally:
        await pool.close()
