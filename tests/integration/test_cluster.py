"""rewardq on a real Redis Cluster: 3 local masters started by the suite, 6 shards.

The cluster is started once per session by :class:`tests.support.cluster.LocalCluster` and stopped by
the PIDs in its pidfiles. If it cannot start, every test here FAILS with the redis log tails:
the cluster path is part of the contract, never silently skipped.

Here: where the keys land, a full run of three workers, and the clients waiting across shards;
recovery and dead letters on the cluster are tests/integration/test_cluster_recovery.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from rewardq import AsyncRewardClient, RewardClient
from rewardq.queue.broker import StreamBroker
from rewardq.queue.keys import Keyspace
from rewardq.reward.tokenizer import load_tokenizer
from tests.support.checks import must
from tests.support.cli_procs import REPO, worker_argv
from tests.support.cluster import SHARDS, ClusterStartError, LocalCluster, assert_drained, uid_on_shard
from tests.support.helpers import (
    SAMPLE,
    open_test_worker,
    output,
    running_workers,
    worker_config,
)
from tests.support.managers import LengthManager
from tests.support.sync_client import ClusterClient, connect_node

# the local cluster (`redis_cluster`), its client (`rc`), a namespace on it (`cns`) and the one-slot
# guard on every script (`single_slot_scripts`) are fixtures of tests/conftest.py, shared with the
# other cluster tests
pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("single_slot_scripts")]


def _shard_owner(rc: ClusterClient, ks: Keyspace) -> dict[int, str]:
    return {s: rc.get_node_from_key(ks.stream(s)).name for s in range(ks.shards)}


def test_a_cluster_that_cannot_start_reports_why() -> None:
    """The fixture fails with the server's own words, and leaves no process or directory behind."""
    c = LocalCluster(node_timeout_ms="not-a-number")  # type: ignore[arg-type]  # the wrong type is the test
    with pytest.raises(ClusterStartError, match="FATAL CONFIG FILE ERROR") as info:
        c.start()
    assert "log tail" in str(info.value) and c.dir is None


# ---------------------------------------------------------------------------------------------
# (a) keyspace placement
# ---------------------------------------------------------------------------------------------
async def test_shards_spread_over_all_masters_and_each_shard_is_one_slot(
    redis_cluster: LocalCluster, cns: str, rc: ClusterClient
) -> None:
    # Given a 6-shard keyspace whose streams and groups exist on the cluster
    ks = Keyspace(cns, SHARDS)
    w = await open_test_worker(
        worker_config(cns, redis_cluster.url, name="placement", shards=SHARDS), manager=LengthManager(None)
    )
    await w.stop()
    masters = {n.name: n for n in rc.get_primaries()}
    assert len(masters) == 3
    owner = _shard_owner(rc, ks)
    for s in range(SHARDS):
        # Then every key of one shard hashes (server side, CLUSTER KEYSLOT) to one slot ...
        keys = [
            ks.stream(s),
            ks.done(s),
            ks.dead(s),
            ks.waiting(s),
            ks.traj(s, "u_s"),
            ks.reward(s, "u_s_0"),
            ks.traj_prefix(s) + "other_tid",
            ks.reward_prefix(s) + "other_tid_7",
        ]
        slots = {int(rc.cluster_keyslot(k)) for k in keys}
        assert slots == {key_slot(ks.stream(s).encode())}, (s, slots)
        # ... and the stream physically lives on the master that owns that slot
        host, port = owner[s].split(":")
        direct = connect_node(host, int(port))
        try:
            assert direct.exists(ks.stream(s)) == 1
            assert direct.execute_command("CLUSTER", "COUNTKEYSINSLOT", next(iter(slots))) >= 1
        finally:
            direct.close()
    # And the six shards sit two by two on the three masters
    per_master: dict[str, list[int]] = {}
    for s, name in owner.items():
        per_master.setdefault(name, []).append(s)
    assert sorted(len(v) for v in per_master.values()) == [2, 2, 2], per_master


async def test_a_script_leaving_its_slot_is_refused(redis_cluster: LocalCluster, cns: str) -> None:
    """The single-slot guard above can fail: fail.lua given another shard's reward prefix."""
    from rewardq.queue.connection import connect_async

    ks = Keyspace(cns, SHARDS)
    client = connect_async(redis_cluster.url)
    try:
        broker = StreamBroker(client, ks, worker="probe")
        await broker.ensure_groups()
        assert isinstance(client, redis.asyncio.cluster.RedisCluster)
        owner = {s: must(client.get_node_from_key(ks.stream(s))).name for s in range(SHARDS)}
        other = next(s for s in range(1, SHARDS) if owner[s] == owner[0])  # same node, other slot
        keys = [ks.traj(0, "u_s"), ks.stream(0), ks.waiting(0), ks.done(0), ks.dead(0), ks.records(0, "u_s")]
        args: list[str | int] = [
            ks.group,
            "u_s",
            ks.reward_prefix(other),
            60,
            "boom",
            "probe",
            0,
            "",
            100,
            100,
            4096,
            0,
            "scorer",  # failure_kind
            "",  # extra_info: {"error": message}
            "",  # provenance
            "",  # attempt
            64 * 1024 * 1024,  # dead_bytes
            3_600_000,  # dead_ttl_ms
            0,  # nacks
        ]
        with pytest.raises(redis.ResponseError, match="do not hash to the same slot"):
            await broker.scripts._scripts["fail"](keys=keys, args=args)
        args[2] = ks.reward_prefix(0)
        # no attempt, no final known, then the one key it wrote (index 0)
        assert await broker.scripts._scripts["fail"](keys=keys, args=args) == [b"", b"", b"0"]
    finally:
        await client.aclose()


# ---------------------------------------------------------------------------------------------
# (b) a full run
# ---------------------------------------------------------------------------------------------
N_TRAJ = 1000


def _response_len(t: int, i: int) -> int:
    return 1 + (7 * t + 13 * i) % 61


@contextlib.contextmanager
def cli_worker(url: str, ns: str, name: str, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m rewardq worker`` against the cluster; SIGTERM by its PID on exit."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "REWARDQ_HEARTBEAT_INTERVAL": "0.2",
        "REWARDQ_MAINTENANCE_INTERVAL": "0.2",
        "REWARDQ_BLOCK_MS": "100",
    }
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rewardq",
                *worker_argv(
                    url,
                    ns,
                    name,
                    "--shards",
                    str(SHARDS),
                    "--batch-size",
                    "32",
                    "--claim-idle",
                    "1",
                    "--log-level",
                    "WARNING",
                    manager="tests.support.managers:LengthManager",
                ),
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


async def test_thousand_trajectories_three_workers_every_key_exact_each_scored_once(
    redis_cluster: LocalCluster, cns: str, rc: ClusterClient, tmp_path: Path
) -> None:
    # Given a CLI worker process and two in-process workers on a 6-shard namespace of the cluster
    url = redis_cluster.url
    ks = Keyspace(cns, SHARDS)
    rng = random.Random(1234)
    sizes = [rng.randint(1, 8) for _ in range(N_TRAJ)]
    client = RewardClient.from_url(url, namespace=cns, shards=SHARDS)
    LengthManager.calls = []
    log = tmp_path / "cli0.log"

    def push() -> list[str]:
        keys: list[str] = []
        for t, n in enumerate(sizes):
            outs = [output(2 + i, _response_len(t, i), seed=t * 8 + i) for i in range(n)]
            keys += client.put_trajectory(f"traj{t}", "sess", outs, SAMPLE)
        return keys

    t_cli = time.perf_counter()
    with cli_worker(url, cns, "cli0", log) as proc:
        for _ in range(2400):  # up to 120 s: a worker process imports torch, slow on a busy machine
            if rc.zscore(ks.workers, "cli0") is not None or proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        assert rc.zscore(ks.workers, "cli0") is not None, f"CLI worker did not start:\n{log.read_text()[-3000:]}"
        t_cli = time.perf_counter() - t_cli
        # When 1,000 trajectories of 1-8 outputs are pushed through redis+cluster:// and awaited
        t0 = time.perf_counter()
        async with running_workers(  # the CLI worker's scoring configuration (one namespace, one configuration)
            cns,
            url,
            [LengthManager(None), LengthManager(None)],
            shards=SHARDS,
            batch_size=32,
            manager="tests.support.managers:LengthManager",
            tokenizer=load_tokenizer("builtin:demo"),
        ) as workers:
            keys = await asyncio.to_thread(push)
            t_push = time.perf_counter() - t0
            results = await asyncio.to_thread(client.wait_rewards, keys, 60)
            t_all = time.perf_counter() - t0
        # counted once the workers stopped: a result is visible before its worker counts it
        scored = {w.name: w.stats["scored"] for w in workers}
        duplicates = sum(w.stats["duplicates"] for w in workers)
        t_stop = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0, log.read_text()[-3000:]
        t_stop = time.perf_counter() - t_stop
    # Then every key has its trajectory's reward: the final output's response length
    assert len(keys) == sum(sizes)
    by_traj: dict[int, set[str]] = {}
    for k, r in results.items():
        t = int(k.split("_")[0][4:])
        assert r.status == "ok" and r.reward_score == float(_response_len(t, sizes[t] - 1)), (k, r)
        assert r.reward_extra_info == {"rows": sizes[t], "gt": "42"}, (k, r)
        by_traj.setdefault(t, set()).add(r.worker)
    # And each trajectory was scored exactly once, by one worker, and all three workers took part
    assert len(by_traj) == N_TRAJ and all(len(ws) == 1 for ws in by_traj.values())
    per_worker = Counter(next(iter(ws)) for ws in by_traj.values())
    print(
        f"\n[cluster] {N_TRAJ} trajectories / {len(keys)} outputs: pushed in {t_push:.2f}s, "
        f"all rewarded in {t_all:.2f}s; trajectories per worker {dict(per_worker)}; CLI worker up in "
        f"{t_cli:.2f}s, stopped in {t_stop:.2f}s"
    )
    assert set(per_worker) == {"w0", "w1", "cli0"}
    assert {n: per_worker[n] for n in scored} == scored
    # (a lease of FAST's 2 s can lapse on a loaded machine: the trajectory is then scored again by
    # the worker that reclaimed it, and the first scorer's commit, finding it done, writes nothing and
    # counts a duplicate; every call beyond the results written is such a one)
    calls = len(LengthManager.calls)
    assert scored["w0"] + scored["w1"] <= calls <= scored["w0"] + scored["w1"] + duplicates, (calls, scored, duplicates)
    done_lens = [rc.xlen(ks.done(s)) for s in range(SHARDS)]
    assert sum(done_lens) == N_TRAJ and min(done_lens) > 0, done_lens
    assert_drained(rc, ks)
    # And the stopped workers unregistered from every shard's group and the presence set
    for s in range(SHARDS):
        names = {_text(c["name"]) for c in rc.xinfo_consumers(ks.stream(s), ks.group)}
        assert not names & {"w0", "w1", "cli0"}, (s, names)
    assert rc.zcard(ks.workers) == 0
    client.close()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# ---------------------------------------------------------------------------------------------
# (d) the async client waiting across shards
# ---------------------------------------------------------------------------------------------
async def test_async_wait_rewards_across_shards(redis_cluster: LocalCluster, cns: str) -> None:
    url = redis_cluster.url
    ks = Keyspace(cns, SHARDS)
    client = AsyncRewardClient.from_url(url, namespace=cns, shards=SHARDS)
    async with running_workers(cns, url, [LengthManager(None), LengthManager(None)], shards=SHARDS, concurrency=8):
        # Given many coroutines each waiting for their own trajectory ...
        async def one(t: int) -> dict[str, Any]:
            keys = await client.put_trajectory(f"a{t}", "s", [output(4, t % 7 + 1)] * (t % 3 + 1), SAMPLE)
            return await client.wait_rewards(keys, timeout=20)

        all_res = await asyncio.gather(*(one(t) for t in range(120)))
        # ... and one call waiting for keys spread over every shard
        spread = []
        for t in range(30):
            spread += await client.put_trajectory(f"b{t}", "s", [output(2, 3), output(2, t + 1)], SAMPLE)
        assert {ks.shard_of_key(k) for k in spread} == set(range(SHARDS))
        res = await client.wait_rewards(spread, timeout=20)
        # And a lone trajectory is reported soon after it is scored
        lone = await client.put_trajectory(uid_on_shard(ks, 5, "lone"), "s", [output(2, 2)], SAMPLE)
        t0 = time.perf_counter()
        await client.wait_rewards(lone, timeout=10)
        lone_s = time.perf_counter() - t0
    print(f"\n[cluster] lone trajectory reward seen {lone_s * 1000:.0f} ms after the put")
    for t, r in enumerate(all_res):
        assert [x.reward_score for x in r.values()] == [float(t % 7 + 1)] * (t % 3 + 1)
    for k, result in res.items():
        assert result.reward_score == float(int(k.split("_")[0][1:]) + 1), k
    assert lone_s < 1.0
    await client.aclose()


async def test_scripts_are_reloaded_after_the_nodes_forget_them(
    redis_cluster: LocalCluster, cns: str, rc: ClusterClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A fresh or failed-over master answers NOSCRIPT: pipelined and single script calls recover."""
    import logging

    url = redis_cluster.url
    ks = Keyspace(cns, SHARDS)
    client = AsyncRewardClient.from_url(url, namespace=cns, shards=SHARDS)
    caplog.set_level(logging.INFO, logger="rewardq.queue")
    async with running_workers(cns, url, [LengthManager(None)], shards=SHARDS):
        before = []
        for t in range(12):
            before += await client.put_trajectory(f"p{t}", "s", [output(2, 2), output(2, t + 1)], SAMPLE)
        await client.wait_rewards(before, timeout=20)
        # Given every master forgets every script (SCRIPT FLUSH goes to all primaries)
        assert rc.script_flush() is True
        caplog.clear()
        # When more trajectories arrive on every shard
        after = []
        for shard in range(SHARDS):
            uid = uid_on_shard(ks, shard, f"q{shard}x")
            after += await client.put_trajectory(uid, "s", [output(2, 2), output(2, shard + 1)], SAMPLE)
        res = await client.wait_rewards(after, timeout=20)
    # Then the workers reloaded the scripts and scored everything
    assert all(r.reward_score == float(ks.shard_of_key(k) + 1) for k, r in res.items())
    assert any("loading it on every primary" in m for m in caplog.messages)
    await client.aclose()
