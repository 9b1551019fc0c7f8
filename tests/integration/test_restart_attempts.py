"""A worker SIGKILLed while scoring and started again under the same ``--name`` (a StatefulSet pod, a
systemd unit) scores what it held as a new attempt: real `rewardq worker` processes on the real Redis.

The restarted process is the same consumer of the group, so its predecessor's leases carry its name;
they carry the dead process's life too (``lease_life``), which is what makes the restart a new
attempt (``take_lease`` in ``rewardq/queue/lua/common.lua``)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest

from rewardq import RewardClient
from rewardq.ledger.read import read_table
from rewardq.ops.inspect import inspect_trajectory
from rewardq.queue.broker import StreamBroker
from rewardq.queue.codec import decode_output
from rewardq.queue.connection import connect_async
from rewardq.queue.entries import Entry, StoreOutcome
from rewardq.queue.keys import Keyspace
from tests.support.cli_procs import START_WAIT, Procs, wait_for, worker_argv
from tests.support.helpers import SAMPLE, output
from tests.support.records import text_output
from tests.support.sync_client import SyncClient

SLOW_REWARD = """
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(2.0)
    return 1.0
"""
N = 16
#: the dead life's leases (600 s) outlive the test: the new life takes them over, never waits them out
FAST = ["--heartbeat-interval", "0.2", "--lease-seconds", "600", "--maintenance-interval", "0.2"]
FAST += ["--claim-idle", "1", "--block-ms", "100", "--concurrency", "2", "--read-ahead", "1"]


def test_a_worker_killed_while_scoring_and_started_again_under_its_name_counts_a_new_attempt(
    procs: Procs, ns: str, redis_url: str, sync_redis: SyncClient, tmp_path: Path
) -> None:
    ks = Keyspace(ns)
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)
    ledger = str(tmp_path / "ledger")
    argv = worker_argv(redis_url, ns, "kb", "--reward-fn", str(reward), "--ledger", ledger, *FAST)
    argv += ["--ledger-flush-interval", "1"]
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = [k for i in range(N) for k in client.put_trajectory(f"t{i}", "s", [text_output(f"a{i}")], SAMPLE)]
    tids = [f"t{i}_s" for i in range(N)]

    def leases() -> dict[str, bytes | None]:
        return {tid: sync_redis.hget(ks.traj(0, tid), "lease") for tid in tids}

    # Given worker kb scoring (a result written, trajectories leased to it), frozen then SIGKILLed
    first = procs.start(argv, tag="first")
    wait_for(
        lambda: any(client.get_rewards(keys).values()) and any(leases().values()),
        START_WAIT,
        "kb scoring",
        procs=[first],
    )
    first.popen.send_signal(signal.SIGSTOP)  # what it held is read while it can change nothing
    held = {tid for tid, holder in leases().items() if holder == b"kb"}
    first.popen.send_signal(signal.SIGKILL)
    first.wait(10)
    assert held and len(held) < N, f"kb held {sorted(held)}: the test needs some held and some not"
    # When it is started again under the same name and finishes everything
    again = procs.start(argv, tag="again")
    wait_for(lambda: all(client.get_rewards(keys).values()), START_WAIT, "every result", procs=[again])
    assert again.terminate(60) == 0, again.stderr()[-2000:]
    results = client.get_rewards(keys)
    client.close()
    # Then what the dead life held was scored again as attempt 2, everything else once
    want = {f"{tid}_0": 2 if tid in held else 1 for tid in tids}
    assert {k: (r.status, r.attempt) for k, r in results.items() if r} == {k: ("ok", n) for k, n in want.items()}
    rows = {r["key"]: r["attempt"] for r in read_table(ledger).to_pylist()}
    assert rows == want
    for tid in tids:
        h = sync_redis.hgetall(ks.traj(0, tid))
        assert int(h.get(b"attempts", 0)) == want[f"{tid}_0"], (tid, h)
        # ... and crash attribution counted the reclaimed attempt's start in a scorer
        assert (int(h.get(b"shared", 0)) >= 1) == (tid in held), (tid, h)


async def _file(broker: StreamBroker, entries: list[Entry]) -> list[StoreOutcome]:
    return await broker.store([(e, decode_output(e.data), bytes(e.data)) for e in entries])


async def test_one_life_filing_a_trajectory_twice_is_one_attempt_and_the_next_life_another(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    for _ in range(2):  # the producer sent trajectory u_s twice: two entries per output
        client.put_trajectory("u", "s", [output(2, 3), output(2, 4)], SAMPLE)
    client.put_trajectory("w", "s", [output(2, 5)], SAMPLE)
    client.close()
    r = connect_async(redis_url)
    try:
        # Given worker kb filing every entry of u_s in one batch, and claiming w_s whole
        first = StreamBroker(r, ks, worker="kb", lease_seconds=600.0)
        await first.ensure_groups()
        entries = await first.read([0], 100, None)
        u, w = entries[:4], entries[4:]
        filed = await _file(first, u)
        assert await first.claim_whole([(0, "w_s", w)]) == [True]
        # Then every entry that found u_s complete is the one attempt this process holds
        assert [o.kind for o in filed] == ["parked", "complete", "complete", "complete"]
        assert [o.attempts for o in filed[1:]] == [1, 1, 1]
        assert [(o.kind, o.attempts) for o in await _file(first, w)] == [("complete", 1)]  # w_s again
        # When kb is started again under its name (a new process life) while those leases are live
        again = StreamBroker(r, ks, worker="kb", lease_seconds=600.0)
        assert again.life != first.life
        await again.liveness.heartbeat({}, ttl=60)
        assert inspect_trajectory(sync_redis, ks, "u_s")["meta"]["lease_earlier_life"] == "1"
        refiled = await _file(again, [u[1], *w])
        # Then it takes both leases over at once, each as a new attempt
        assert [(o.kind, o.attempts) for o in refiled] == [("complete", 2), ("complete", 2)]
        # ... and the dead life can neither renew nor hand back what its successor holds
        held = {0: ["u_s", "w_s"]}
        assert await first.liveness.renew(held) == 0
        assert await first.liveness.release(held, idle_ms=0) == 0
        assert await again.liveness.renew(held) == 2
        assert inspect_trajectory(sync_redis, ks, "u_s")["meta"]["lease_earlier_life"] == ""
    finally:
        await r.aclose()
    for tid in ("u_s", "w_s"):
        h = sync_redis.hgetall(ks.traj(0, tid))
        assert (h[b"lease"], h[b"lease_life"], h[b"attempts"]) == (b"kb", again.life.encode(), b"2"), h


async def test_two_live_processes_under_one_name_are_told_a_restarted_one_is_not(
    ns: str, redis_url: str, sync_redis: SyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    from rewardq.ops.status import collect
    from rewardq.queue.reads import workers_status

    ks = Keyspace(ns)
    r = connect_async(redis_url)
    try:
        # Given a process that beat under kb and died, and its restart beating under the same name
        dead = StreamBroker(r, ks, worker="kb")
        await dead.liveness.heartbeat({}, ttl=60)
        restarted = StreamBroker(r, ks, worker="kb")
        with caplog.at_level(logging.ERROR, logger="rewardq.worker"):
            for _ in range(3):
                await restarted.liveness.heartbeat({}, ttl=60)
        # Then the restart is not taken for a twin: its first beat found its predecessor, the rest its own
        assert restarted.liveness.shared_name_at == 0.0 and not caplog.records
        # When a second live process beats under kb beside it
        twin = StreamBroker(r, ks, worker="kb")
        with caplog.at_level(logging.ERROR, logger="rewardq.worker"):
            for _ in range(3):
                await twin.liveness.heartbeat({}, ttl=60)
                at = restarted.liveness.shared_name_at  # what the worker's snapshot publishes
                stats: dict[str, object] = {"shared_name_at": f"{at:.3f}"} if at else {}
                await restarted.liveness.heartbeat(stats, ttl=60)
        # Then both find out, each says so once (not every beat), and status warns about the name
        assert restarted.liveness.shared_name_at > 0 and twin.liveness.shared_name_at > 0
        said = [rec.getMessage() for rec in caplog.records]
        assert len(said) == 2 and all("share --name kb" in m for m in said), said
        [w] = workers_status(sync_redis, ks)
        assert w["shared_name_s_ago"] is not None and w["shared_name_s_ago"] < 60
        warned = [d["message"] for d in collect(sync_redis, ks)["diagnosis"] if "worker name(s) kb" in d["message"]]
        assert warned and "its own --name" in warned[0], warned
    finally:
        await r.aclose()


async def test_an_unfinished_attempt_counts_once_and_only_for_the_life_holding_the_lease(
    ns: str, redis_url: str
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    client.put_trajectory("u", "s", [output(2, 3)], SAMPLE)
    client.close()
    r = connect_async(redis_url)
    try:
        # Given a life of kb holding the lease of u_s, and another life of kb
        holder = StreamBroker(r, ks, worker="kb")
        await holder.ensure_groups()
        entries = await holder.read([0], 10, None)
        assert await holder.claim_whole([(0, "u_s", entries)]) == [True]
        other = StreamBroker(r, ks, worker="kb")
        # When the other life says its attempt ended unanswered, then the holder says so twice (its
        # call resent after a lost reply)
        await other.attempts.note_unfinished(0, "u_s", "not mine")
        for _ in range(2):
            await holder.attempts.note_unfinished(0, "u_s", "a commit Redis refused")
        # Then one unfinished attempt is counted, the holder's
        history = await holder.attempts.attempt_history(0, "u_s")
        assert (history["unfinished"], history["last_failure"]) == (1, "a commit Redis refused")
    finally:
        await r.aclose()
