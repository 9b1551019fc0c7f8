"""Replies lost after Redis ran the command: the retry policy sends the command again, and what it
counts must be counted once.

A dropped connection (``CLIENT KILL``, a proxy reset) can take a reply with it after Redis ran the
command; the one retry policy (:mod:`rewardq.queue.retry`) then sends the command again on a new
connection. The starts that crash attribution counts (:mod:`rewardq.consumers.quarantine`) are
counted by a script, so each re-sent count must count nothing more: a start counted twice is a
worker death the trajectory never caused, and after ``max_crashes`` of them it got an error result
(kind ``crashed``) and a dead letter under nothing but dropped connections.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rewardq import RewardClient
from rewardq.queue import scripts
from rewardq.queue.broker import StreamBroker
from rewardq.queue.connection import connect_async
from rewardq.queue.keys import Keyspace
from tests.integration.test_faults import FAST, START_TIMEOUT
from tests.support.exactly_once import make_trajectories, push, settle
from tests.support.proc_worker import WorkerProcess
from tests.support.redis_server import RedisServer
from tests.support.reply_loss import ReplyLossProxy


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _count_proxy(server: RedisServer) -> ReplyLossProxy:
    """A proxy losing the first reply of every distinct ``count`` call (the script loaded first,
    so the lost reply is the script's own, not a ``NOSCRIPT``)."""
    r = server.client()
    try:
        sha = r.execute_command("SCRIPT", "LOAD", scripts.source("count", True))
    finally:
        r.close()
    return ReplyLossProxy(("127.0.0.1", server.port), marker=sha.encode() if isinstance(sha, str) else bytes(sha))


async def test_a_start_counted_again_after_a_lost_reply_counts_once(server: RedisServer) -> None:
    ks = Keyspace(f"lr-{uuid.uuid4().hex[:6]}")
    with _count_proxy(server) as proxy:
        client = connect_async(proxy.url())
        notes = StreamBroker(client, ks, worker="w").attempts
        direct = server.client()
        try:
            # Given a start whose reply is lost after the script ran (the policy sends it again)
            assert await notes.start_shared(0, "t_s", attempt=2) == 1
            assert proxy.lost == 1, "no reply was lost: the test did not test anything"
            # Then it was counted once; taking it back, reply lost too, takes back once
            assert direct.hget(ks.traj(0, "t_s"), "shared") == b"1"
            assert await notes.start_shared(0, "t_s", by=-1, attempt=2) == 0
            assert proxy.lost == 2 and direct.hget(ks.traj(0, "t_s"), "shared") == b"0"
            # and a start of a later attempt counts again
            assert await notes.start_shared(0, "t_s", attempt=3) == 1
        finally:
            await client.aclose()
            direct.close()


def _score_then_die(server: RedisServer, url: str, ns: str, tmp_path: Path, name: str) -> None:
    """Start a worker whose manager never finishes, wait until it scores, SIGKILL it (one mark
    directory for all: the options are the namespace's one scoring configuration)."""
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    w = WorkerProcess(
        url,
        ns,
        log_dir=tmp_path,
        name=name,
        manager_options={"sleep": 3600, "mark_dir": str(marks)},
        concurrency=1,
        **{**FAST, "max_crashes": 2},
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT + 60
        while not any(m.name.startswith(f"{w.pid}-") for m in marks.iterdir()):
            assert w.alive(), w.log()
            assert time.monotonic() < deadline, f"{name} never started scoring:\n{w.log()}"
            time.sleep(0.05)
    finally:
        w.kill()


def test_lost_replies_of_start_counts_blame_no_crash(server: RedisServer, tmp_path: Path) -> None:
    # Given a trajectory whose workers die while scoring it three times (each death one that it may
    # have caused), every worker behind a proxy that loses the first reply of each count it sends
    ns = f"lr-{uuid.uuid4().hex[:6]}"
    ks = Keyspace(ns)
    client = RewardClient.from_url(server.url, namespace=ns)
    jobs = make_trajectories(1, seed=3, max_outputs=3)
    keys = push(client, jobs)
    r = server.client()
    with _count_proxy(server) as proxy:
        try:
            for name in ("first", "second", "third"):
                _score_then_die(server, proxy.url(), ns, tmp_path, name)
            # (the first death counted nothing, the second a start beside others, the third one alone)
            tid = keys[0].rpartition("_")[0]
            # When a fourth worker takes it over
            rescuer = WorkerProcess(
                proxy.url(), ns, log_dir=tmp_path, name="rescuer", takeover=True, **{**FAST, "max_crashes": 2}
            )
            try:
                client.wait_rewards(keys, timeout=120)
                # Then one death while it was scored alone is below max_crashes=2: it is scored
                verdict = settle(r, ks, jobs[0].expected)
                assert verdict.clean, f"{verdict.explain()}\n{r.xrange(ks.dead(0))}\n{rescuer.log()}"
                assert proxy.lost >= 3, f"only {proxy.lost} replies lost: the test did not test the re-sends"
                h = r.hmget(ks.traj_key(tid), ["attempts", "shared", "solo"])
                assert h == [b"4", b"1", b"2"], h
                assert rescuer.terminate() == 0, rescuer.log()
            finally:
                rescuer.kill()
        finally:
            client.close()
            r.close()
