"""A verl run's failure budget on the real Redis: lua/budget.lua's ring, and FleetBudget's stop rule.

The budget is shared by every adapter and hook process of a run (tests/verl/test_fleet_budget.py
drives 8 hook processes); here, its parts: the window's ring and counts, a new window starting the
hash anew, the run's totals and the dropped count the V1 step metrics read, the TTL, and the stop
rule under concurrent callers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rewardq.errors import RunStopped
from rewardq.integrations.verl.budget import LABELS, OK, Failure, FleetBudget
from rewardq.queue.clients import AsyncRedis
from rewardq.queue.connection import connect_async, connect_sync
from rewardq.queue.failure_budget import BUDGET_TTL, DROPPED, OutcomeWindow, run_totals
from rewardq.queue.keys import Keyspace


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[AsyncRedis]:
    r = connect_async(redis_url)
    yield r
    await r.aclose()


def window_of(client: AsyncRedis, ns: str) -> OutcomeWindow:
    return OutcomeWindow(client, Keyspace(ns).verl_budget("job-1"), LABELS)


async def test_the_ring_holds_the_last_window_outcomes_and_the_totals_hold_all(client: AsyncRedis, ns: str) -> None:
    w = window_of(client, ns)
    replies = [await w.record(label, 4) for label in ("ok", "scorer", "scorer", "timeout", "ok", "ok")]
    assert [filled for filled, _ in replies] == [1, 2, 3, 4, 4, 4]
    _, counts = replies[-1]  # the last 4: scorer, timeout, ok, ok
    assert (counts["ok"], counts["scorer"], counts["timeout"], counts["transient"]) == (2, 1, 1, 0)
    assert await w.totals() == {**dict.fromkeys(LABELS, 0), "ok": 3, "scorer": 2, "timeout": 1}
    assert 0 < await client.ttl(w.key) <= BUDGET_TTL


async def test_another_window_starts_the_run_anew(client: AsyncRedis, ns: str) -> None:
    w = window_of(client, ns)
    for _ in range(3):
        await w.record("scorer", 8)
    filled, counts = await w.record("ok", 16)
    assert (filled, counts["scorer"], counts["ok"]) == (1, 0, 1)


async def test_a_window_out_of_bounds_and_an_unknown_outcome_are_refused(client: AsyncRedis, ns: str) -> None:
    w = window_of(client, ns)
    with pytest.raises(Exception, match="budget window must be a whole number"):
        await w.record("ok", 0)
    with pytest.raises(ValueError, match="unknown outcome"):
        await w.record("weather", 4)
    assert await client.exists(w.key) == 0


async def test_dropped_sessions_are_counted_with_the_ttl_and_read_by_a_blocking_client(
    client: AsyncRedis, ns: str, redis_url: str
) -> None:
    w = window_of(client, ns)
    await w.count_dropped(1)  # a key that did not exist yet still gets its TTL
    assert 0 < await client.ttl(w.key) <= BUDGET_TTL
    await w.record("ok", 4)
    await w.count_dropped(2)
    sync = connect_sync(redis_url)
    try:
        totals = run_totals(sync, w.key, (*LABELS, DROPPED))
    finally:
        sync.close()
    assert totals[DROPPED] == 3 and totals[OK] == 1


async def test_the_budget_stops_only_on_a_failure_once_the_window_is_full(client: AsyncRedis, ns: str) -> None:
    w, budget = window_of(client, ns), FleetBudget(0.5, 4, settings_hint="REWARDQ_VERL_MAX_ERROR_RATE")
    boom = Failure("the judge answered 503", "transient")
    for _ in range(3):
        await budget.record(w, boom)  # the window is not full: no stop by chance
    with pytest.raises(RunStopped, match=r"4 of the run's last 4 trajectories.*4 transient.*503"):
        await budget.record(w, boom)
    await budget.record(w, None)  # a scored trajectory never raises, however full of failures the window
    with pytest.raises(RunStopped):
        await budget.record(w, boom)  # 4 failures of 4 again
    for _ in range(3):
        await budget.record(w, None)
    await budget.record(w, boom)  # recovered: 1 failure of the last 4


async def test_concurrent_callers_see_one_window(client: AsyncRedis, ns: str) -> None:
    """The Lua script serialises the run's callers: with every trajectory failing, exactly
    ``window - 1`` go through before the stop, however many callers race."""
    w, budget = window_of(client, ns), FleetBudget(0.5, 16)

    async def caller() -> int:
        through = 0
        for _ in range(40):
            try:
                await budget.record(w, Failure("boom", "scorer"))
            except RunStopped:
                return through
            through += 1
        return through

    assert sum(await asyncio.gather(*(caller() for _ in range(8)))) == 15


async def test_outcomes_of_one_loop_turn_go_in_one_call_each_answered_in_order(
    client: AsyncRedis, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = window_of(client, ns)
    calls = 0
    script: Any = w._script

    async def counting(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await script(**kwargs)

    monkeypatch.setattr(w, "_script", counting)
    outcomes = ["ok", "scorer", "ok", "timeout", "ok", "scorer"]
    replies = await asyncio.gather(*(w.record(o, 4) for o in outcomes))
    assert calls == 1
    # each reply is the window just after its own outcome, as if recorded alone
    assert [filled for filled, _ in replies] == [1, 2, 3, 4, 4, 4]
    assert [c["scorer"] for _, c in replies] == [0, 1, 1, 1, 1, 1]  # the last scorer took the first's slot
    assert [c["ok"] for _, c in replies] == [1, 1, 2, 2, 2, 2]
    assert replies[-1][1] == {**dict.fromkeys(LABELS, 0), "ok": 2, "scorer": 1, "timeout": 1}
    assert [await w.record("ok", 4) for _ in range(2)][-1][0] == 4 and calls == 3  # one call per turn alone
