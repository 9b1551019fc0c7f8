"""A judge paid once per distinct question, and never for a question nobody waits for: real
`rewardq worker` processes on the real Redis against the stand-in judge (4 s per answer), which
counts what it receives.

* 16 identical responses over 2 workers cost 1 request, and the fleet's rate limiter counts one;
  the leader's worker SIGKILLed mid-call costs at most one more, and every key is answered.
* 50 trajectories queued behind the judge, 40 cancelled: the judge sees at most 10 +
  ``max_concurrent`` requests, the cancelled keys read ``cancelled``, and the limiter's slots and
  request tokens are back afterwards.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from tests.integration.test_genrm_fleet import FAST, SAMPLE, both_alive, config_file, start_workers, stop
from tests.support.cli_procs import Procs, wait_for
from tests.support.judge_standin import JudgeStandin
from tests.support.records import text_output
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.slow

ANSWER_SECONDS = 4.0
RECOVERY = ["--claim-idle", "3", "--lease-seconds", "3"]


@pytest.fixture
def judge(tmp_path: Path) -> Iterator[JudgeStandin]:
    s = JudgeStandin(tmp_path)
    s.control(delay=ANSWER_SECONDS)
    yield s
    s.stop()


def identical(client: RewardClient, n: int) -> list[str]:
    """``n`` trajectories with the same question, response and ground truth: one judge request."""
    return [key for i in range(n) for key in client.put_trajectory(f"same{i}", "s", [text_output("it is 42")], SAMPLE)]


def test_sixteen_identical_responses_on_two_workers_cost_one_request_and_one_rate_limit_token(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, judge: JudgeStandin, tmp_path: Path
) -> None:
    # Given two workers holding one trajectory each (so both get some) and sharing max_rpm 1: a
    # bucket of 1/60 token, so a second request would wait a minute
    config = config_file(tmp_path, judge, max_rpm=1)
    names = ["d0", "d1"]
    workers = start_workers(procs, redis_url, ns, names, config, *FAST, "--concurrency", "1", "--batch-size", "1")
    both_alive(sync_redis, ns, names, workers)
    client = RewardClient.from_url(redis_url, namespace=ns)
    # When 16 identical responses arrive
    keys = identical(client, 16)
    results = client.wait_rewards(keys, timeout=120)
    # Then every key has the judge's score, both workers scored some, ...
    assert {r.status for r in results.values()} == {"ok"} and {r.reward_score for r in results.values()} == {1.0}
    by_worker = {n: sum(r.worker == n for r in results.values()) for n in names}
    assert min(by_worker.values()) > 0, by_worker
    # ... the judge received one request, ...
    stats = judge.stats()
    assert (stats["received"], stats["served"]) == (1, 1), stats
    # ... the fleet's counters say 1 request and 15 answers reused, ...
    judges = {k.decode(): int(v) for k, v in sync_redis.hgetall(f"{ns}:judge-stats").items()}
    assert judges["requests:judge-model"] == 1 and judges["cache_hits:judge-model"] == 15, judges
    # ... and the rate limiter took one token: the level it stored is a new bucket's (1/60) minus 1
    level = float(sync_redis.hget(f"{ns}:ratelimit:genrm", "b:rpm:tokens") or "nan")
    assert level == pytest.approx(1 / 60 - 1, abs=1e-9), level
    print(f"16 identical responses on 2 workers {by_worker}: {stats['received']} request, rpm bucket {level:.4f}")
    stop(client, workers)


def test_the_leaders_worker_sigkilled_mid_call_costs_at_most_one_more_request_and_every_key_is_answered(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, judge: JudgeStandin, tmp_path: Path
) -> None:
    # Given two workers with max_concurrent 1 (a dead holder's slot and claim lapse after 3 s)
    config = config_file(tmp_path, judge, max_concurrent=1, lease_seconds=3)
    names = ["k0", "k1"]
    workers = dict(
        zip(names, start_workers(procs, redis_url, ns, names, config, *FAST, "--batch-size", "2", *RECOVERY))
    )
    both_alive(sync_redis, ns, names, list(workers.values()))
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = identical(client, 16)
    # When the request is in flight, the worker holding its claim is SIGKILLed
    wait_for(lambda: judge.stats()["in_flight"] == 1, 60, "the request in flight", procs=list(workers.values()))
    claims = [sync_redis.hget(k, "c") for k in sync_redis.keys(f"{ns}:judge:*")]
    leader = next(n for n in names for c in claims if c and c.decode().startswith(f"{n}:"))
    workers[leader].popen.send_signal(signal.SIGKILL)
    workers[leader].popen.wait(timeout=10)
    survivor = next(n for n in names if n != leader)
    results = client.wait_rewards(keys, timeout=120)
    # Then every key is answered with the judge's score, by the survivor for the dead worker's share
    assert {r.status for r in results.values()} == {"ok"} and {r.reward_score for r in results.values()} == {1.0}
    assert {r.worker for r in results.values()} <= set(names)
    # ... and the judge received at most 2 requests (the one the dead worker paid for, and the waiter's)
    stats = judge.stats()
    assert stats["received"] <= 2 and stats["served"] >= 1, stats
    # ... and nothing holds the fleet's concurrency slot any more
    wait_for(
        lambda: not [f for f in sync_redis.hkeys(f"{ns}:ratelimit:genrm") if f.startswith(b"s:")], 10, "slots free"
    )
    print(f"leader {leader} SIGKILLed mid-call: {stats['received']} requests received, {stats['served']} served")
    stop(client, [workers[survivor]])


def test_forty_of_fifty_queued_trajectories_cancelled_cost_no_requests_and_give_the_budget_back(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, judge: JudgeStandin, tmp_path: Path
) -> None:
    # Given a worker holding 8 trajectories at once, behind a judge that takes 4 s and max_concurrent 2
    max_concurrent = 2
    config = config_file(tmp_path, judge, max_concurrent=max_concurrent, max_rpm=600)
    [w] = start_workers(procs, redis_url, ns, ["c0"], config, *FAST, "--concurrency", "8", "--metrics-port", "0")
    both_alive(sync_redis, ns, ["c0"], [w])
    client = RewardClient.from_url(redis_url, namespace=ns)
    # When 50 distinct trajectories are queued, and 40 are cancelled once the judge is busy
    keys = [
        client.put_trajectory(f"q{i}", "s", [text_output(f"case {i} grade=0.{i % 10}")], SAMPLE)[0] for i in range(50)
    ]
    wait_for(lambda: judge.stats()["in_flight"] == max_concurrent, 60, "the judge busy", procs=[w])
    cancelled, kept = keys[:40], keys[40:]
    t0 = time.monotonic()
    written = client.cancel(cancelled)
    # Then the cancelled keys read `cancelled` at once, with no score and no failure kind
    now = client.get_rewards(cancelled)
    assert written == 40 and all(r is not None and r.status == "cancelled" for r in now.values()), now
    assert all(r is not None and r.reward_score is None and r.failure_kind is None for r in now.values())
    # ... the ten others are scored, ...
    results = client.wait_rewards(kept, timeout=180)
    for i, key in enumerate(kept, start=40):
        assert results[key].status == "ok" and results[key].reward_score == pytest.approx(i % 10 / 10), results[key]
    # ... the judge received at most 10 + max_concurrent requests, the calls in flight were aborted, ...
    stats = judge.stats()
    assert stats["received"] <= 10 + max_concurrent, stats
    assert stats["served"] == 10, stats
    # ... the cancelled keys still read `cancelled` (none scored later, nothing reclaimed them), ...
    assert all(r is not None and r.status == "cancelled" for r in client.get_rewards(cancelled).values())
    # ... and the limiter's budget is back: no slot held, and every aborted call's request token returned
    limiter = {k.decode(): v.decode() for k, v in sync_redis.hgetall(f"{ns}:ratelimit:genrm").items()}
    assert not [f for f in limiter if f.startswith("s:")], limiter
    judges = {k.decode(): int(v) for k, v in sync_redis.hgetall(f"{ns}:judge-stats").items()}
    aborted = judges.get("aborted:judge-model", 0)
    # the calls in flight at the judge were abandoned (the stand-in saw the client go), and every
    # call holding a request token (at most the 8 held trajectories) gave it back
    assert stats["abandoned"] == stats["received"] - stats["served"] <= max_concurrent, stats
    assert stats["abandoned"] <= aborted <= 8, (judges, stats)
    assert w.popen.poll() is None
    print(
        f"50 queued, 40 cancelled after {time.monotonic() - t0:.1f}s: {stats['received']} requests received "
        f"(<= {10 + max_concurrent}), {stats['served']} served, {stats['abandoned']} abandoned at the judge, "
        f"{aborted} calls gave their request token back"
    )
    stop(client, [w])


def test_a_cancelled_trajectory_left_pending_by_a_dead_worker_is_dropped_by_the_reclaim_not_scored(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, judge: JudgeStandin, tmp_path: Path
) -> None:
    # Given a trajectory a worker read and died with before it stored anything (its entry pending)
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    sync_redis.xgroup_create(ks.stream(0), ks.group, id="0", mkstream=True)  # as a worker's start does
    [key] = client.put_trajectory("gone", "s", [text_output("grade=1")], SAMPLE)
    sync_redis.xreadgroup(ks.group, "dead-worker", {ks.stream(0): ">"}, count=10)
    assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 1
    # When its producer cancels it, and a worker comes to reclaim what the dead one left (one
    # delivery allowed: an entry it claimed would be dead-lettered unread)
    assert client.cancel([key]) == 1
    config = config_file(tmp_path, judge)
    [w] = start_workers(procs, redis_url, ns, ["r1"], config, *FAST, *RECOVERY, "--max-deliveries", "1")
    both_alive(sync_redis, ns, ["r1"], [w])
    wait_for(lambda: sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0, 30, "the entry dropped", procs=[w])
    [neighbour] = client.put_trajectory("after", "s", [text_output("grade=0.5")], SAMPLE)
    assert client.wait_rewards([neighbour], timeout=60)[neighbour].reward_score == 0.5
    # Then it still reads `cancelled`, the judge was asked only about the neighbour, its entry is
    # gone, and no dead letter was written
    r = client.get_reward(key)
    assert r is not None and r.status == "cancelled", r
    assert judge.stats()["received"] == 1
    assert sync_redis.xlen(ks.stream(0)) == 0 and sync_redis.xlen(ks.dead(0)) == 0
    stop(client, [w])
