"""Scorer processes hold one call queued ahead, and a queued call is never held up by the one
before it (real child processes)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from rewardq.reward.execution.process_pool import ScorerPool

TARGET = "tests.support.queued_calls:noted"


def call(notes: Path, name: str, verb: str) -> dict[str, object]:
    return {
        "data_source": "t",
        "solution_str": verb,
        "ground_truth": verb,
        "extra_info": {"notes": str(notes), "name": name},
    }


def ran(notes: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in notes.read_text().splitlines()) if notes.exists() else Counter()


async def test_each_process_holds_one_call_queued_ahead(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    pool = ScorerPool(TARGET, num_workers=2)
    await pool.start()
    try:
        # Given four calls of 0.5 s for two processes
        tasks = [asyncio.ensure_future(pool.run(call(notes, f"c{i}", "sleep:0.5"), 30)) for i in range(4)]
        await asyncio.sleep(0.1)
        # Then each process holds one running and one queued behind it, and none waits unsent
        assert sorted(len(s.sent) for s in pool._slots) == [2, 2] and not pool._pending
        results = await asyncio.gather(*tasks)
        assert [r.status for r in results] == ["ok"] * 4
        assert ran(notes) == Counter({f"c{i}": 1 for i in range(4)})
    finally:
        await pool.close()


async def test_a_call_queued_behind_a_hung_one_goes_to_the_next_idle_process(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    timeout = 8.0
    pool = ScorerPool(TARGET, num_workers=2, spare_after=None)  # no spares: only taking back can help
    await pool.start()
    try:
        # Given a hung call, then three good ones (one of them queued behind the hung call)
        t0 = time.monotonic()
        hung = asyncio.ensure_future(pool.run(call(notes, "hung", "hang"), timeout))
        await asyncio.sleep(0.05)
        good = [asyncio.ensure_future(pool.run(call(notes, f"g{i}", "sleep:0.2"), timeout)) for i in range(3)]
        await asyncio.sleep(0.05)
        assert max(len(s.sent) for s in pool._slots) == 2
        # Then every good call finishes long before the hung one times out, each run once
        results = await asyncio.gather(*good)
        took = time.monotonic() - t0
        assert [r.status for r in results] == ["ok"] * 3
        assert took < timeout / 2, took
        assert pool.counters["taken_back"] >= 1
        assert ran(notes) == Counter({"hung": 1, "g0": 1, "g1": 1, "g2": 1})
        # And the hung call still ends at its own timeout, its process replaced
        assert (await hung).status == "timeout"
        assert pool.counters["timeouts"] == 1
    finally:
        await pool.close()


async def test_a_queued_call_whose_caller_gives_up_never_runs_and_its_process_stays(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    pool = ScorerPool(TARGET, num_workers=1)
    await pool.start()
    try:
        pid = pool.pids[0]
        first = asyncio.ensure_future(pool.run(call(notes, "first", "sleep:0.5"), 30))
        queued = asyncio.ensure_future(pool.run(call(notes, "queued", "sleep:0.1"), 30))
        await asyncio.sleep(0.1)
        assert len(pool._slots[0].sent) == 2
        # When the queued call's caller gives up
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        # Then the running call finishes in the same process, the queued one never runs
        assert (await first).status == "ok"
        after = await pool.run(call(notes, "after", "sleep:0"), 30)
        assert after.status == "ok" and after.pid == pid and pool.pids == [pid]
        assert ran(notes) == Counter({"first": 1, "after": 1})
        assert pool.counters["replaced"] == 0
    finally:
        await pool.close()
