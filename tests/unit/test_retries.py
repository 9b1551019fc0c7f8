"""The retry in place, its parts alone: the pause, the window, and a rest that frees a place.

Given :class:`Retries` on stand-in attempt notes (the window's start and the notes are Redis's; here a
dict), the pause honours ``Retry-After`` (never sooner, up to half again later) or else the one
backoff with jitter; the window runs from the first transient failure and is never passed; and
:class:`InFlightTable` lets other trajectories in while some rest.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from rewardq.consumers.inflight import InFlightTable
from rewardq.consumers.metrics import NoMetrics
from rewardq.consumers.retries import Retries
from rewardq.errors import FleetConfigError, TransientError
from rewardq.queue.attempts import AttemptNotes


class Notes:
    """What Retries asks of the attempt notes: the window's start (kept per trajectory) and the notes."""

    def __init__(self, since: float | None = None, fail: bool = False) -> None:
        self.since: dict[str, float] = {}
        self.given = since
        self.fail = fail
        self.notes: list[tuple[str, str, float]] = []

    async def retry_since(self, shard: int, tid: str, now: float) -> float:
        if self.fail:
            raise ConnectionError("Redis is away")
        return self.since.setdefault(tid, self.given if self.given is not None else now)

    async def note_retry(self, shard: int, tid: str, why: str, at: float) -> None:
        self.notes.append((tid, why, at))


def retries(notes: Notes, retry_for: float = 60.0, rand: float = 0.5, **kw: Any) -> Retries:
    return Retries(
        cast(AttemptNotes, notes),
        retry_for=retry_for,
        stopping=asyncio.Event(),
        metrics=NoMetrics(),
        stats={},
        rand=lambda: rand,
        **kw,
    )


def test_a_retry_after_is_honoured_never_sooner_and_spread_up_to_half_again() -> None:
    assert retries(Notes(), rand=0.0).pause(1, 5.0) == 5.0
    assert retries(Notes(), rand=0.999999).pause(7, 5.0) == pytest.approx(7.5, abs=1e-5)
    assert retries(Notes(), rand=0.0).pause(1, 0.0) == 0.0


def test_without_retry_after_the_backoff_doubles_to_its_cap_with_half_of_it_random() -> None:
    r = retries(Notes(), rand=0.0)
    assert [r.pause(k, None) for k in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    r = retries(Notes(), rand=0.999999)
    assert r.pause(3, None) == pytest.approx(2.0, abs=1e-5)  # 4 s, half of it drawn away


async def test_a_transient_failure_waits_and_others_do_not() -> None:
    b = Notes()
    r = retries(b, rand=0.0)
    t0 = time.time()
    wait = await r.plan(0, "t", "judged", TransientError("503", retry_after=2.0))
    assert wait is not None and wait.retries == 1 and wait.data_source == "judged"
    assert 2.0 <= wait.at - t0 < 2.5 and wait.until == pytest.approx(b.since["t"] + 60.0)
    assert b.notes == [("t", "503", wait.at)] and r.stats["retries"] == 1
    again = await r.plan(0, "t", "judged", TransientError("503"))
    assert again is not None and again.retries == 2 and again.since == wait.since
    assert await r.plan(0, "u", "judged", FleetConfigError("401")) is None
    assert await r.plan(0, "v", "judged", ValueError("a bug")) is None
    assert r.gave_up("u") == "" and r.gave_up("v") == ""


async def test_the_window_is_the_fleets_and_is_never_passed() -> None:
    # Given a trajectory whose first transient failure was 59 s ago (another worker's), retry_for 60
    r = retries(Notes(since=time.time() - 59.0), rand=0.0)
    # a backoff longer than what is left becomes a last try as the window closes
    wait = await r.plan(0, "t", "", TransientError("down"))
    assert wait is not None and wait.at <= wait.until + 1e-6 and wait.at - time.time() < 1.01
    # a Retry-After past the window fails at once, saying so
    r2 = retries(Notes(since=time.time() - 30.0), rand=0.0)
    assert await r2.plan(0, "t", "", TransientError("down", retry_after=45.0)) is None
    assert "the server asked to retry after 45s, later than the 30.0s left; retry_for=60s ran out" in r2.gave_up("t")
    # a Retry-After that fits, whose jitter does not, is a last try as the window closes
    r5 = retries(Notes(since=time.time() - 50.0), rand=0.999999)
    fits = await r5.plan(0, "t", "", TransientError("down", retry_after=9.0))
    assert fits is not None and fits.at == pytest.approx(fits.until, abs=0.01)
    # a spent window fails at once
    r3 = retries(Notes(since=time.time() - 61.0), rand=0.0)
    assert await r3.plan(0, "t", "", TransientError("down")) is None
    assert "retry_for=60s ran out" in r3.gave_up("t")
    # retry_for 0 never retries
    r4 = retries(Notes(), retry_for=0.0)
    assert await r4.plan(0, "t", "", TransientError("down")) is None
    assert r4.gave_up("t") == " (not retried: retry_for=0)"


async def test_redis_away_keeps_this_workers_own_window() -> None:
    r = retries(Notes(fail=True), rand=0.0)
    first = await r.plan(0, "t", "", TransientError("down"))
    second = await r.plan(0, "t", "", TransientError("down"))
    assert first is not None and second is not None and second.since == first.since and second.retries == 2


async def test_a_wait_ends_at_its_time_or_at_once_when_the_worker_stops() -> None:
    r = retries(Notes(), rand=0.0)
    wait = await r.plan(0, "t", "", TransientError("down", retry_after=0.2))
    assert wait is not None
    t0 = time.monotonic()
    assert await r.wait(wait) is True and time.monotonic() - t0 >= 0.15
    long = await r.plan(0, "t", "", TransientError("down", retry_after=30.0))
    assert long is not None
    waiting = asyncio.ensure_future(r.wait(long))
    await asyncio.sleep(0.05)
    assert r.snapshot(time.time())["n"] == 1
    assert r.snapshot(time.time())["waiting"][0]["tid"] == "t"
    r.stopping.set()
    assert await asyncio.wait_for(waiting, 1.0) is False and r.waiting == {}


async def test_resting_trajectories_leave_room_for_others_up_to_a_bound() -> None:
    table = InFlightTable(2, max_resting=3, read_ahead=0)
    for tid in ("a", "b"):
        table.hold(0, tid)
    assert not table.capacity.is_set()  # two held: full
    table.rest("a")
    assert table.capacity.is_set()  # one rests: room for another
    table.hold(0, "c")
    assert not table.capacity.is_set()
    table.rest("b")
    assert table.capacity.is_set()
    table.hold(0, "d")
    assert not table.capacity.is_set()  # c and d count
    table.rest("c")
    assert not table.capacity.is_set() and table.resting == {"a", "b", "c"}  # as many rest as may
    table.wake("a")
    assert not table.capacity.is_set()  # a and d count again
    table.finished("d")
    assert table.capacity.is_set()  # a counts, b and c rest
    table.finished("b")
    assert table.resting == {"c"}
    table.stop_admitting()
    table.hold(0, "f")
    table.hold(0, "g")
    assert table.capacity.is_set()  # a stopping worker's readers never wait again
