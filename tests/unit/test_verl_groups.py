"""rewardq.integrations.verl.groups: when a V1 prompt's scored sessions keep their place."""

from __future__ import annotations

import asyncio

from rewardq.integrations.verl.groups import SessionGroup, SessionGroups


async def test_two_scored_sessions_decide_at_once_and_keep() -> None:
    group = SessionGroup(8)
    group.scored(0)
    assert not group.decided()
    group.scored(5)
    assert group.decided() and await group.wait() is True


async def test_a_lone_scored_session_waits_for_its_siblings_then_is_dropped() -> None:
    group = SessionGroup(4)
    group.scored(2)
    waiting = asyncio.create_task(group.wait())
    for session in (0, 1):
        group.ended(session)  # failed, or its agent loop raised
        await asyncio.sleep(0)
        assert not waiting.done()
    group.ended(3)
    assert await waiting is False


async def test_a_failed_session_waits_and_learns_whether_its_group_stores_others() -> None:
    group = SessionGroup(4)
    group.failed(1)  # its reward failed: it waits inside its post-processing
    waiting = asyncio.create_task(group.wait())
    group.scored(0)
    await asyncio.sleep(0)
    assert not waiting.done()
    group.scored(3)
    assert await waiting is True and group.scored_sessions == {0, 3}


async def test_a_group_whose_sessions_all_failed_stores_nothing() -> None:
    group = SessionGroup(2)
    group.failed(0)
    group.failed(1)
    assert group.decided() and await group.wait() is False and not group.scored_sessions


async def test_a_scored_session_ending_is_not_a_failed_one() -> None:
    group = SessionGroup(3)
    group.scored(0)
    group.ended(0)  # a scored session ends after it was stored
    group.ended(1)
    assert not group.decided()
    group.scored(2)
    assert await group.wait() is True


async def test_a_group_of_one_by_design_keeps_verls_rule() -> None:
    group = SessionGroup(1)
    group.scored(0)
    assert await group.wait() is True


async def test_every_waiter_wakes_on_the_deciding_change() -> None:
    group = SessionGroup(3)
    waiters = [asyncio.create_task(group.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    group.scored(0)
    group.scored(1)
    assert await asyncio.gather(*waiters) == [True, True, True]


def test_groups_open_once_per_uid() -> None:
    groups = SessionGroups()
    assert groups.open("u", 4) is True
    assert groups.open("u", 4) is False  # the same uid running twice at once: the second keeps verl's rule
    group = groups.get("u")
    assert group is not None and group.n == 4
    groups.close("u")
    assert groups.get("u") is None
