"""No result can take down the shared Redis or its neighbours' commits: real Redis, real workers.

* A reward function returning 10 MiB of extra info for a 300-output trajectory: Redis stays up
  and small, PING stays fast, the key gets an error naming the scorer process's reply limit
  (8 x ``max_result_bytes``), the good
  trajectories beside it are correct; a large but legal result on 300 keys is committed in
  bounded chunks, all keys appearing at once.
* A self-referencing, too deep, or ambiguous extra info among 300 good trajectories fails only
  its own trajectory (naming the problem): every good one scores on its first delivery.
* A chunked commit is invisible until its last chunk, which also acknowledges.
* A reward function returning 1 GiB of extra info is refused in its scorer process: the worker's
  resident memory does not grow.

The memory-hungry case runs on a throwaway ``redis-server --maxmemory 2gb --maxmemory-policy
noeviction`` with a PING sampler in its own process; the others on the shared Redis in their own
namespaces (nothing they write is large).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rewardq import RewardClient
from rewardq.consumers.worker import Worker
from rewardq.queue.broker import STAGE_TTL, StreamBroker
from rewardq.queue.connection import connect_async
from rewardq.queue.keys import Keyspace
from tests.support.checks import must
from tests.support.cli_procs import START_WAIT
from tests.support.helpers import open_test_worker, output, results_for, worker_config
from tests.support.ping_sampler import PingSampler
from tests.support.proc_worker import WorkerProcess
from tests.support.records import text_output
from tests.support.redis_server import RedisServer
from tests.support.sync_client import SyncClient

MAXMEMORY = ["--maxmemory", "2gb", "--maxmemory-policy", "noeviction"]
REWARD_FN = "tests/support/hostile_results.py:hostile_result"
MANAGER = "tests.support.hostile_results:HostileResultManager"
MiB = 1024 * 1024
GB = 10**9


def _trajectory(client: RewardClient, uid: str, final_text: str, n: int = 1, *, truth: str = "0.42") -> list[str]:
    """A trajectory of ``n`` outputs whose final response is ``final_text``; returns its keys."""
    outputs = [text_output(f"turn {i}") for i in range(n - 1)] + [text_output(final_text)]
    sample = {"data_source": "test", "reward_model": {"ground_truth": truth}}
    return client.put_trajectory(uid, "0", outputs, sample)


def _good(client: RewardClient, prefix: str, count: int) -> dict[str, float]:
    """``count`` good trajectories of 1-3 outputs; each key's expected reward."""
    want: dict[str, float] = {}
    for i in range(count):
        truth = f"{(i % 90) / 100 + 0.01:.2f}"
        for k in _trajectory(client, f"{prefix}{i}", "good", 1 + i % 3, truth=truth):
            want[k] = float(truth)
    return want


@contextmanager
def _hostile_worker(url: str, ns: str, log_dir: Path, *, scorer_processes: int) -> Iterator[WorkerProcess]:
    """A ``rewardq worker`` process scoring with :data:`REWARD_FN`, started; stopped after."""
    worker = WorkerProcess(
        url,
        ns,
        cli=True,
        log_dir=log_dir,
        manager="naive",
        tokenizer="builtin:demo",
        reward_fn=REWARD_FN,
        scorer_processes=scorer_processes,
    )
    try:
        assert worker.wait_for_log(f"worker {worker.name} started", START_WAIT), worker.log()
        yield worker
    finally:
        worker.terminate(60)


def _used_memory_peak(r: Any) -> int:
    return int(r.info("memory")["used_memory_peak"])


# alone: it compares Redis's PING answers under the commits with an idle phase before them
@pytest.mark.slow
@pytest.mark.alone
def test_a_10_mib_extra_info_on_300_outputs_keeps_redis_up_small_and_responsive(tmp_path: Path) -> None:
    ns = "big"
    with RedisServer(extra=MAXMEMORY) as srv, _hostile_worker(srv.url, ns, tmp_path, scorer_processes=2):
        r = srv.client()
        client = RewardClient.from_url(srv.url, namespace=ns)
        _ = client.keyspace
        try:
            with PingSampler(srv.url) as idle:
                time.sleep(1.0)
            with PingSampler(srv.url) as sampler:
                # Given good trajectories on both sides of a 300-output trajectory whose reward
                # function returns 10 MiB of extra info (one result for every key), and of one whose
                # 900 KiB result is legal (270 MB over its 300 keys: more than one commit script may write)
                want = _good(client, "a", 40)
                blob = _trajectory(client, "blob", "blob:10", 300)
                near = _trajectory(client, "near", "near:900", 300)
                want.update(_good(client, "b", 40))
                # When the worker has answered every key
                got = client.wait_rewards(list(want), timeout=180)
                bad = client.wait_rewards(blob, timeout=180)
                large = client.wait_rewards(near, timeout=180)
            peak = _used_memory_peak(r)
            alive = r.ping()
            staged = list(r.scan_iter(match=f"{ns}:*:staged:*", count=1000))
            done = {f[b"tid"]: f for _, f in r.xrange(Keyspace(ns).done(0))}
        finally:
            client.close()
            r.close()
    # Then Redis stayed up, under 1 GB and answering PING quickly throughout
    print(f"\nused_memory_peak {peak / 1e6:.0f} MB; PING idle {idle.result}; under load {sampler.result}")
    assert alive and peak < 1 * GB, peak
    assert sampler.result["samples"] > 50
    assert sampler.result["worst_ms"] < max(1000.0, 20 * idle.result["worst_ms"]), (idle.result, sampler.result)
    # And every key of the 10 MiB trajectory has an error naming the limit: the scorer process
    # refused to send back more than 8 x max_result_bytes (8 MiB)
    assert {x.status for x in bad.values()} == {"error"}
    reason = bad[blob[-1]].error
    assert "8,388,608 bytes a scorer process may send back" in (reason or "") and "max_result_bytes" in (reason or "")
    # And the good trajectories are correct
    assert {k: (x.status, x.reward_score) for k, x in got.items()} == {k: ("ok", v) for k, v in want.items()}
    # And the legal 270 MB result reached every key, published once, nothing left staged
    assert {(x.status, x.reward_score, len(x.reward_extra_info["pad"])) for x in large.values()} == {
        ("ok", 0.5, 900 * 1024)
    }
    assert done[b"near_0"][b"status"] == b"ok" and done[b"near_0"][b"n"] == b"300" and not staged


async def _score_in_process(ns: str, url: str, **settings: Any) -> Worker:
    """Start an in-process worker (its manager built from ``settings``, as ``rewardq worker`` does)."""
    w = await open_test_worker(worker_config(ns, url, **settings))
    w.task = asyncio.create_task(w.run())  # type: ignore[attr-defined]
    return w


async def _stop(w: Worker) -> None:
    w.request_stop("test done")
    await w.task  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "settings, text, reason",
    [
        (dict(manager=MANAGER), "cycle", "reward_extra_info.self refers back to reward_extra_info"),
        (dict(manager=MANAGER, manager_options={"per_output": True}), "cycle", "refers back to"),
        (dict(manager=MANAGER), "deep", "nests dicts/lists deeper than 64 levels"),
        (dict(manager=MANAGER), "keys", "which JSON writes as one key"),
        (
            dict(manager="naive", tokenizer="builtin:demo", reward_fn=REWARD_FN, scorer_processes=2),
            "cycle",
            "refers back to reward_extra_info",
        ),
    ],
    ids=["manager-cycle", "per-output-cycle", "manager-deep", "manager-keys", "reward-fn-cycle"],
)
async def test_a_bad_extra_info_fails_only_its_trajectory_and_never_its_commit_batch(
    ns: str, redis_url: str, sync_redis: SyncClient, settings: dict[str, Any], text: str, reason: str
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    _ = client.keyspace
    w = await _score_in_process(ns, redis_url, claim_idle=3.0, **settings)
    try:
        # Given 300 good trajectories read and committed together with one whose extra info is bad
        want = _good(client, "g", 150)
        bad = _trajectory(client, "bad", text, 3)
        want.update(_good(client, "h", 150))
        # When the worker has answered every key
        got = await asyncio.to_thread(client.wait_rewards, list(want), 120)
        failed = await asyncio.to_thread(client.wait_rewards, bad, 60)
    finally:
        await _stop(w)
        client.close()
    # Then every good trajectory was scored right, on its first delivery: nothing reclaimed, one attempt each
    assert {k: (x.status, x.reward_score) for k, x in got.items()} == {k: ("ok", v) for k, v in want.items()}
    assert w.stats["reclaimed"] == 0
    tids = {k.rpartition("_")[0] for k in want}
    assert {sync_redis.hget(ks.traj(0, t), "attempts") for t in tids} == {b"1"}
    # And the bad one has an error naming what is wrong with it, on every key, and one scoring dead letter
    assert {x.status for x in failed.values()} == {"error"}
    whose = "bad_0_2" if settings.get("manager_options") else "all 3 keys of bad_0"
    assert all(reason in (x.error or "") and f"the result of {whose}" in (x.error or "") for x in failed.values()), (
        failed
    )
    dead = sync_redis.xrange(ks.dead(0))
    assert [(f[b"kind"], f[b"tid"]) for _, f in dead] == [(b"scoring", b"bad_0")]
    assert b"probably crashed" not in dead[0][1][b"reason"]


async def test_a_lone_surrogate_in_extra_info_is_stored_as_a_replacement_character(ns: str, redis_url: str) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    _ = client.keyspace
    w = await _score_in_process(ns, redis_url, manager=MANAGER)
    try:
        keys = _trajectory(client, "sur", "surrogate", 2)
        got = await asyncio.to_thread(client.wait_rewards, keys, 60)
    finally:
        await _stop(w)
        client.close()
    assert {(x.status, x.reward_score) for x in got.values()} == {("ok", 0.3)}
    assert got[keys[-1]].reward_extra_info == {"pred": "bad\ufffdtext"}


async def test_a_chunked_commit_shows_nothing_until_its_last_chunk_acknowledges(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    # Given a complete trajectory of 20 outputs held by a broker whose scripts write at most 4 kB each
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = client.put_trajectory("ch", "s", [output(2, 3, seed=i) for i in range(20)], {"data_source": "t"})
    r = connect_async(redis_url)
    broker = StreamBroker(r, ks, worker="w", commit_bytes=4000)
    try:
        await broker.ensure_groups()
        entries = await broker.read([0], 100, None)
        assert await broker.claim_whole([(0, "ch_s", entries)]) == [True]  # its entries stay pending
        results = results_for("ch_s", 20, 800)
        calls = broker.commit_calls(0, "ch_s", broker.encode(results))
        assert len(calls) > 3
        # When a worker runs every chunk but the last, then dies
        for keys_, args in calls[:-1]:
            assert await broker.scripts.run("commit", keys_, args) == 1
        # Then no result is visible, the entries are still pending, and the staged results expire
        assert client.get_rewards(keys) == {k: None for k in keys}
        assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 20
        staged = list(sync_redis.scan_iter(match=f"{ns}:*:staged:*", count=1000))
        assert staged and all(0 < sync_redis.ttl(k) <= STAGE_TTL for k in staged)
        # When another attempt commits it whole
        assert await broker.commit(0, "ch_s", results) is True
        # Then every key has its own result, the entries are acknowledged, `done` has one entry
        got = client.get_rewards(keys)
        assert [must(x).reward_score for x in got.values()] == [float(i) for i in range(20)]
        assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0
        assert sync_redis.xlen(ks.done(0)) == 1
        assert all(0 < sync_redis.ttl(ks.reward(0, k)) <= broker.result_ttl for k in keys)
        # And a repeated commit changes nothing
        assert await broker.commit(0, "ch_s", results_for("ch_s", 20, 900)) is False
        assert (
            sync_redis.xlen(ks.done(0)) == 1 and must(client.get_reward(keys[3])).reward_extra_info["pad"] == "z" * 800
        )
        # And the dead attempt's staged keys are all that is left staged, expiring
        left = set(sync_redis.scan_iter(match=f"{ns}:*:staged:*", count=1000))
        assert left == set(staged)
    finally:
        await r.aclose()
        client.close()


async def test_a_commit_script_refuses_to_write_more_than_its_byte_budget(ns: str, redis_url: str) -> None:
    ks = Keyspace(ns)
    r = connect_async(redis_url)
    broker = StreamBroker(r, ks, worker="w", commit_bytes=4000)
    try:
        enc = broker.encode(results_for("bb_s", 20, 800))
        wide = StreamBroker(r, ks, worker="w", commit_bytes=10**9)
        ((keys_, args),) = wide.commit_calls(0, "bb_s", enc)
        args[14] = 4000  # the budget this script call is given: far less than the 20 keys it writes
        with pytest.raises(Exception, match="over its 4000-byte budget"):
            await broker.scripts.run("commit", keys_, args)
    finally:
        await r.aclose()


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for process {pid}")


@pytest.mark.slow
def test_a_1_gib_extra_info_is_refused_in_its_scorer_process_and_costs_the_worker_little(tmp_path: Path) -> None:
    ns = "gib"
    with RedisServer(extra=MAXMEMORY) as srv, _hostile_worker(srv.url, ns, tmp_path, scorer_processes=1) as worker:
        client = RewardClient.from_url(srv.url, namespace=ns)
        try:
            warm = client.wait_rewards(_good(client, "w", 3), timeout=120)  # every lazy import done
            # Given the worker's resident memory now, its peak reset to it
            rss0 = _kib(worker.pid, "VmRSS")
            Path(f"/proc/{worker.pid}/clear_refs").write_text("5")
            # When its reward function returns 1 GiB of extra info for a trajectory
            keys = _trajectory(client, "gib", "blob:1024", 3)
            got = client.wait_rewards(keys, timeout=300)
            peak = _kib(worker.pid, "VmHWM")
            after = client.wait_rewards(_good(client, "a", 3), timeout=120)
        finally:
            client.close()
    growth_mb = (peak - rss0) * 1024 / 1e6
    print(f"\n1 GiB of extra info: worker RSS {rss0 * 1024 / 1e6:.0f} MB, peak after {peak * 1024 / 1e6:.0f} MB")
    # Then the worker's memory grew by under 100 MB: the result never crossed the pipe
    assert growth_mb < 100, growth_mb
    # And every key has an error naming the limit, and the worker scores on
    assert {x.status for x in got.values()} == {"error"}
    assert all("8,388,608 bytes a scorer process may send back" in (x.error or "") for x in got.values()), got
    assert {x.status for x in (warm | after).values()} == {"ok"}
