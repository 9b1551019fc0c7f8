"""A fleet of real worker processes shares a backlog, and takes a dead worker's entries over while busy.

Three ``tests.support.proc_worker`` processes on a throwaway ``redis-server``, scoring with
``EchoManager`` (an ``asyncio.sleep`` per trajectory, so scoring takes as long on a loaded machine).
The conditions are shares and orderings, never wall-clock bounds (:mod:`tests.support.fleet_share`
says how each run is staged):

* three workers resumed at once on a backlog of 150 each score a real share of it (the first to
  read used to take all 150 in one read of ``batch_size`` 256);
* a worker SIGKILLed while the fleet is busy has its trajectories scored, each exactly once, while
  much of the backlog is still waiting (its entries used to wait until the survivors had drained
  the whole backlog, since a reclaim needed a worker with room).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet_share import recover_dead_worker, share_backlog
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow

#: 8 slots and the default read_ahead (1.0): a worker holds at most 16 trajectories.
CONCURRENCY = 8
HELD_AT_MOST = 2 * CONCURRENCY
#: A dead worker's entries are reclaimable ~5 s after its last heartbeat; a maintenance pass each second.
RECOVERY: dict[str, Any] = dict(
    claim_idle=5.0, lease_seconds=3.0, heartbeat_interval=0.5, maintenance_interval=1.0, block_ms=200
)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _ns(tag: str) -> str:
    return f"fs-{tag}-{uuid.uuid4().hex[:6]}"


def test_three_workers_resumed_on_a_backlog_each_score_a_share_of_it(server: RedisServer, tmp_path: Path) -> None:
    # Given three workers of 8 slots, paused while a backlog of 150 trajectories is pushed
    r = server.client()
    try:
        # When all three resume at once (0.5 s per trajectory)
        share = share_backlog(
            server.url, r, _ns("share"), tmp_path, backlog=150, sleep=0.5, concurrency=CONCURRENCY, block_ms=200
        )
    finally:
        r.close()
    # Then every trajectory is scored exactly once, and every worker scored at least a fifth of an
    # even share (10 of 150): the first to read holds at most 16, not the whole backlog
    assert share.clean, share.explain
    assert sum(share.counts) == 150, share.per_worker
    assert min(share.counts) >= 10, f"a worker was left idle while another held the backlog: {share.per_worker}"


def test_a_dead_workers_trajectories_are_scored_once_while_the_busy_survivors_still_have_backlog(
    server: RedisServer, tmp_path: Path
) -> None:
    # Given three workers of 8 slots on a backlog of 600 trajectories of 1 s each (two survivors
    # need ~40 s for it, eight times claim_idle)
    r = server.client()
    try:
        # When one is SIGKILLed once 20 are done
        rec = recover_dead_worker(
            server.url,
            r,
            _ns("dead"),
            tmp_path,
            backlog=600,
            sleep=1.0,
            kill_after=20,
            concurrency=CONCURRENCY,
            **RECOVERY,
        )
    finally:
        r.close()
    # Then it held some trajectories, no more than its bound (not the whole backlog)
    assert 0 < rec.held_trajectories <= HELD_AT_MOST, rec
    # and every trajectory, its own included, finished exactly once with the expected reward
    assert rec.finished_once and rec.clean, rec.explain
    # and its last trajectory finished while a quarter of the backlog was still to be scored after it:
    # the busy survivors took them over, they did not wait until they had drained the backlog
    assert rec.done_after_last_of_dead >= 150, rec
    assert rec.last_of_dead < 0.75 * rec.all_done, rec
