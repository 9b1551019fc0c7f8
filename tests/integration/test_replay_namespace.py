"""Taking a ``--namespace`` for a replay on the real Redis: the check and the mark are one decision.
Two replays that both found a namespace unused cannot both take it, and what appears between the
check and the mark is noticed; a resume (the mark already there) still goes on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rewardq import RewardClient
from rewardq.errors import ConfigError
from rewardq.ledger.replay import Trajectory
from rewardq.queue.keys import Keyspace
from rewardq.queue.namespace import ReplayMark
from rewardq.replay.namespace import check_namespace, mark_namespace, replay_mark
from tests.support.cli_procs import START_WAIT, Procs, wait_for, worker_argv
from tests.support.helpers import output, worker_config
from tests.support.sync_client import SyncClient

SAMPLE = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "42"}}
TRAJS = [Trajectory(f"t{i}", "s", [output(3, 3, seed=i)], SAMPLE) for i in range(4)]


@pytest.mark.parametrize("their_out", ["out-1", "out-2"])  # the same --out as this replay's, or another
def test_of_two_replays_that_found_a_namespace_unused_only_the_first_to_mark_it_runs(
    redis_url: str, ns: str, sync_redis: SyncClient, their_out: str
) -> None:
    cfg = worker_config(ns, redis_url)
    mine, theirs = replay_mark("out-1", "fp-1"), replay_mark(their_out, "fp-1")
    # Given two replays that both found the namespace unused
    resuming, they_resume = check_namespace(cfg, TRAJS, mine), check_namespace(cfg, TRAJS, theirs)
    assert (resuming, they_resume) == (False, False)
    # When the other one marks it first
    mark_namespace(cfg, theirs, resuming=they_resume)
    # Then this one is refused, and the mark stays the other's
    with pytest.raises(ConfigError, match="marked by another replay .* between this replay's check and its mark"):
        mark_namespace(cfg, mine, resuming=resuming)
    assert ReplayMark.decode(sync_redis.get(Keyspace(ns).replay)) == theirs


def test_a_fleet_starting_between_check_and_mark_is_noticed_and_the_mark_removed(
    redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    cfg = worker_config(ns, redis_url)
    mark = replay_mark("out-1", "fp-1")
    resuming = check_namespace(cfg, TRAJS, mark)
    # a fleet's producer puts a trajectory after the check
    fleet = RewardClient.from_url(redis_url, namespace=ns)
    try:
        fleet.put_trajectory("fleet", "s", [output(3, 3, seed=9)], SAMPLE)
    finally:
        fleet.close()
    with pytest.raises(ConfigError, match=r"already holds its meta .*\(written since this replay checked it\)"):
        mark_namespace(cfg, mark, resuming=resuming)
    # the refused replay leaves no mark: a run again is checked anew, not taken for a resume
    assert sync_redis.get(Keyspace(ns).replay) is None
    with pytest.raises(ConfigError, match="already holds"):
        check_namespace(cfg, TRAJS, mark)


def test_a_resume_goes_on_in_its_namespace_unless_a_worker_came_alive_since_the_check(
    redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    cfg = worker_config(ns, redis_url)
    ks = Keyspace(ns)
    mark = replay_mark("out-1", "fp-1")
    # Given a namespace a stopped replay marked and left its trajectories in
    mark_namespace(cfg, mark, resuming=check_namespace(cfg, TRAJS, mark))
    producer = RewardClient.from_url(redis_url, namespace=ns)
    try:
        for t in TRAJS:
            producer.put_trajectory(t.uid, t.session_id, t.outputs, t.sample)
    finally:
        producer.close()
    # When it is run again with the same mark, it resumes there
    resuming = check_namespace(cfg, TRAJS, mark)
    assert resuming
    mark_namespace(cfg, mark, resuming=resuming)
    # but a worker whose heartbeat appeared after the check refuses the resume, and keeps the mark
    resuming = check_namespace(cfg, TRAJS, mark)
    now = time.time()
    sync_redis.hset(ks.worker("w-late"), mapping={"pid": 1, "last_beat": f"{now:.3f}", "started_at": f"{now:.3f}"})
    sync_redis.zadd(ks.workers, {"w-late": now})
    with pytest.raises(ConfigError, match="served by 1 live worker.*w-late"):
        mark_namespace(cfg, mark, resuming=resuming)
    assert ReplayMark.decode(sync_redis.get(ks.replay)) == mark


def test_a_worker_refuses_a_namespace_a_replay_holds_until_its_mark_is_deleted(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, tmp_path: Path
) -> None:
    ks = Keyspace(ns)
    out = tmp_path / "new"
    cfg = worker_config(ns, redis_url)
    mark = replay_mark("out-1", "fp-1", str(out))
    # Given a namespace a replay into --out took (its own worker has not started yet)
    mark_namespace(cfg, mark, resuming=check_namespace(cfg, TRAJS, mark))
    # When a fleet's worker starts there
    fleet = procs.start(worker_argv(redis_url, ns, "fleet-0"), tag="fleet")
    wait_for(lambda: fleet.popen.poll() is not None or sync_redis.exists(ks.worker("fleet-0")), START_WAIT,
             "the worker's exit or heartbeat", procs=[fleet])  # fmt: skip
    # Then it exits 2 naming the namespace, the replay's --out and both ways on, having written nothing
    log = fleet.stderr()
    assert fleet.popen.poll() == 2, log[-3000:]
    assert f"namespace {ns!r} is held by `rewardq replay` into --out {out}" in log, log[-3000:]
    assert "another --namespace" in log and f"redis-cli DEL {ks.replay}" in log, log[-3000:]
    assert sorted(sync_redis.scan_iter(match=f"{ns}:*")) == [ks.replay.encode()]
    # and once the mark is deleted as the refusal says, a worker starts there
    sync_redis.delete(ks.replay)
    fleet = procs.start(worker_argv(redis_url, ns, "fleet-1"), tag="fleet-after")
    wait_for(lambda: sync_redis.exists(ks.worker("fleet-1")), START_WAIT, "the worker's heartbeat", procs=[fleet])
    assert fleet.terminate() == 0, fleet.stderr()[-3000:]
