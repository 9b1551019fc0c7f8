"""Which awaited trajectories one sweep asks about (``rewardq.producers.reading.sweep_share``)."""

import asyncio
import contextlib
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from rewardq.producers.reading import sweep_share


def test_few_trajectories_are_all_asked_about_every_time() -> None:
    assert sweep_share(["a", "b", "c"], 7, 3) == (["a", "b", "c"], 0)


def test_more_than_the_limit_are_taken_in_turn_and_every_one_comes_round() -> None:
    tids = [f"t{i}" for i in range(10)]
    seen: list[str] = []
    start = 0
    for _ in range(4):
        share, start = sweep_share(tids, start, 4)
        assert len(share) == 4 and len(set(share)) == 4
        seen += share
    assert set(seen) == set(tids)
    assert sweep_share(tids, 8, 4)[0] == ["t8", "t9", "t0", "t1"]  # wraps round


def test_a_sweep_that_gets_no_answer_says_so_in_its_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sweep past its time limit is a TimeoutError with no text: the warning names what happened."""
    from rewardq.producers import aio

    async def stuck() -> None:
        await asyncio.sleep(3600)

    async def failing() -> None:
        raise ConnectionError()

    async def run(sweep: Any) -> None:
        client = SimpleNamespace(_watchers={"t": object()}, _sweep=sweep)
        task = asyncio.create_task(aio.AsyncRewardClient._sweep_forever(client))  # type: ignore[arg-type]
        await asyncio.sleep(0.2)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    monkeypatch.setattr(aio, "SWEEP_INTERVAL", 0.01)
    with caplog.at_level(logging.WARNING, logger=aio.logger.name):
        asyncio.run(run(stuck))
        asyncio.run(run(failing))
    said = [r.getMessage() for r in caplog.records]
    assert any("done-stream sweep: no answer within 0 s (Redis slow" in m for m in said), said
    assert any("done-stream sweep: ConnectionError;" in m for m in said), said
    assert not any("sweep: ;" in m for m in said), said
