"""Redis stays near its ``maxmemory`` under legal results, and no key is lost: real Redis, real worker.

A throwaway ``redis-server --maxmemory 300mb --maxmemory-policy noeviction`` (300 MiB), one worker
process, trajectories of 300 outputs whose reward function returns 900 KiB of extra info (a legal
result: under ``max_result_bytes``), each trajectory's results taking ~315 MB in Redis (jemalloc
keeps each 900 KiB value in a 1 MiB block). The test reads every result as it appears and deletes
it, as a trainer does. The commit scripts are refused whole past ``maxmemory``
(:mod:`rewardq.queue.scripts`) and the worker waits for room (:class:`~rewardq.consumers.retries.RoomWaits`),
so Redis's peak stays within one chunk of its cap, every key gets its own right result, and the
refusals are logged.

Results that never fit (more than the whole cap) wait ``room_wait`` seconds, then their keys get an
error result of kind ``memory`` naming their size and the cap. The worker files records past
``maxmemory`` (``store`` declares ``allow-oom``: it adds at most one small record), keeps a large
one in its stream entry (no copy through Lua), while the producer's own write is refused.

Dead letters stay small: 40 outputs of 31 MB that all fail keep a 64 KiB prefix each, and a PING
sampler (its own process, every 10 ms) finds Redis's 99th percentile within a factor of 2 of an
idle control server's at the same time, and of the same records scored fine: a 31 MB record
travels as a blob of 1 MiB pieces (:mod:`rewardq.queue.blobs`), so no ``XADD`` or ``XREADGROUP``
of tens of MB holds Redis, and ``store`` never copies one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from rewardq import RewardClient
from rewardq.errors import RedisOutOfMemory
from rewardq.queue import scripts
from rewardq.queue.broker import STORE_INLINE_BYTES, StreamBroker
from rewardq.queue.codec import decode_output
from rewardq.queue.connection import connect_async, is_out_of_memory
from rewardq.queue.results import RewardResult
from tests.support.cli_procs import START_WAIT
from tests.support.ping_sampler import PingSampler
from tests.support.proc_worker import WorkerProcess
from tests.support.records import text_output
from tests.support.redis_server import RedisServer
from tests.support.sync_client import SyncClient

REWARD_FN = "tests/support/hostile_results.py:hostile_result"
CAP = ["--maxmemory", "300mb", "--maxmemory-policy", "noeviction"]
#: The bound the check asks for: 330 MB (the cap is 300 MiB = 314.6 MB).
BOUND = 330 * 10**6
READ_AT_ONCE = 4  # ~4 MB of results per read: the reply buffer counts in Redis's memory too
#: The PING p99 (ms) below which the 31 MB records' check does not compare ratios (see its last lines).
FLOOR_MS = 5.0


def _worker(url: str, ns: str, log_dir: Path, **settings: Any) -> WorkerProcess:
    """A ``rewardq worker`` process scoring with :data:`REWARD_FN` behind the naive manager."""
    settings.setdefault("scorer_processes", 1)
    return WorkerProcess(
        url, ns, cli=True, log_dir=log_dir, manager="naive", tokenizer="builtin:demo", reward_fn=REWARD_FN, **settings
    )


def _trajectory(client: RewardClient, uid: str, n: int) -> list[str]:
    outputs = [text_output(f"turn {i}") for i in range(n - 1)] + [text_output("near:900")]
    return client.put_trajectory(uid, "0", outputs, {"data_source": "test", "reward_model": {"ground_truth": "0"}})


def _answer_all(
    client: RewardClient, r: SyncClient, keys: list[str]
) -> tuple[dict[str, tuple[str, float | None, int]], float]:
    """Read every result as it appears and delete it, as a trainer does: ``{key: (status, score, pad
    bytes)}`` and the seconds it took (at most 900)."""
    seen: dict[str, tuple[str, float | None, int]] = {}
    t0 = time.monotonic()
    while len(seen) < len(keys) and time.monotonic() - t0 < 900:
        pending = [k for k in keys if k not in seen]
        for a in range(0, len(pending), READ_AT_ONCE):
            for k, x in client.get_rewards(pending[a : a + READ_AT_ONCE]).items():
                if x is not None:
                    pad = len((x.reward_extra_info or {}).get("pad", ""))
                    seen[k] = (x.status, x.reward_score, pad)
                    r.delete(client.keyspace.reward_key(k))
        time.sleep(0.05)
    return seen, time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("trajectories", "workers", "batch_size"),
    [(4, 1, None), (8, 1, None), (8, 3, 32)],
    ids=["4-trajectories", "8-trajectories", "3-workers-batch-32"],
)
def test_legal_results_past_a_300_mib_cap_wait_for_room_and_every_key_is_answered(
    tmp_path: Path, trajectories: int, workers: int, batch_size: int | None
) -> None:
    with RedisServer(extra=CAP) as srv:
        ns = "cap"
        r = srv.client()
        client = RewardClient.from_url(srv.url, namespace=ns)
        ks = client.keyspace
        batch: dict[str, Any] = {} if batch_size is None else {"batch_size": batch_size}
        procs = [
            _worker(srv.url, ns, tmp_path, scorer_processes=2 if workers == 1 else 1, **batch) for _ in range(workers)
        ]
        try:
            for w in procs:
                assert w.wait_for_log(f"worker {w.name} started", START_WAIT), w.log()
            # Given trajectories of 300 keys whose results take ~315 MB each, more than the cap together
            keys = [k for i in range(trajectories) for k in _trajectory(client, f"near{i}", 300)]
            # When a trainer reads each result as it appears, and deletes it
            seen, took = _answer_all(client, r, keys)
            mem = r.info("memory")
            staged = list(r.scan_iter(match=f"{ns}:*:staged:*", count=1000))
            done = r.xlen(ks.done(0))
            alive = [w.alive() for w in procs]
            log = "".join(w.log() for w in procs)
        finally:
            for w in procs:
                w.terminate(60)
            client.close()
            r.close()
    peak = int(mem["used_memory_peak"])
    print(
        f"\n{trajectories} x 300 keys x 900 KiB through a 300 MiB Redis, {workers} worker(s), batch size "
        f"{batch_size or 'default'}: used_memory_peak {peak / 1e6:.1f} MB, {len(seen)}/{len(keys)} keys answered "
        f"in {took:.1f}s, {log.count('Redis is past its maxmemory and refused')} refusal episode(s) logged, "
        f"{log.count('waits for the chunked commit staging now')} wait(s) for the stage lease, "
        f"{log.count('heartbeat failed')} failed heartbeat(s)"
    )
    # Then every key was answered with its own right result (scored: none a memory error), none lost,
    # nothing left staged, and every worker is still running
    assert len(seen) == len(keys), (len(seen), len(keys), log[-3000:])
    assert set(seen.values()) == {("ok", 0.5, 900 * 1024)}
    assert done == trajectories and not staged
    assert all(alive) and "Traceback" not in log and "failed:" not in log, log[-3000:]
    # And Redis's peak stayed under 330 MB (its cap is 314.6 MB), and the worker said it waited
    assert peak < BOUND, peak
    assert "Redis is past its maxmemory and refused" in log and "Redis took writes again" in log


def _put_40(client: RewardClient, uid: str, *, one_trajectory: bool) -> list[str]:
    """40 outputs of 31 MB: of one trajectory (past max_trajectory_bytes after 8), or 40 trajectories."""
    big = {"prompt_ids": np.zeros(31_000_000 // 4, dtype=np.int32), "response_ids": np.ones(8, dtype=np.int32)}
    sample = {"data_source": "test", "reward_model": {"ground_truth": "0.5"}}
    if one_trajectory:
        return [client.put_output(uid, "s", i, big, sample, final=i == 39) for i in range(40)]
    return [client.put_output(f"{uid}{i}", "s", 0, big, sample, final=True) for i in range(40)]


# alone: it compares Redis's PING answers under the dead letters with a baseline phase
@pytest.mark.slow
@pytest.mark.alone
def test_dead_letters_of_40_records_of_31_mb_stay_small_and_cost_redis_little(tmp_path: Path) -> None:
    # Given a throwaway Redis (its slowlog on), an idle control server, a PING sampler on both, and a
    # worker per namespace
    slowlog = ["--slowlog-log-slower-than", "5000", "--slowlog-max-len", "10000"]
    with (
        RedisServer(extra=["--maxmemory", "2gb", "--maxmemory-policy", "noeviction", *slowlog]) as srv,
        RedisServer() as idle,
    ):
        r = srv.client()
        ok = RewardClient.from_url(srv.url, namespace="ok")
        client = RewardClient.from_url(srv.url, namespace="dl")
        ks = client.keyspace
        workers = [_worker(srv.url, ns, tmp_path) for ns in ("ok", "dl")]
        try:
            for w in workers:
                assert w.wait_for_log(f"worker {w.name} started", START_WAIT), w.log()
            # And a baseline: the same 40 puts of 31 MB as 40 trajectories that score fine
            with PingSampler(srv.url, control=idle.url) as baseline:
                fine = ok.wait_rewards(_put_40(ok, "fine", one_trajectory=False), timeout=300)
            r.slowlog_reset()
            with PingSampler(srv.url, control=idle.url) as sampler:
                # When a producer puts the 40 outputs into one trajectory: it fails after 8, and every
                # later output arrives after it finished; each is dead-lettered
                got = client.wait_rewards(_put_40(client, "big", one_trajectory=True), timeout=300)
            slow = _slowlog_ms(r)
            dead = [f for s in range(ks.shards) for _, f in r.xrange(ks.dead(s))]
            dead_bytes = sum(int(r.memory_usage(ks.dead(s)) or 0) for s in range(ks.shards))
            counted = int(r.hget(ks.dead_bytes(0), "n") or 0)
            ttl = r.pttl(ks.dead(0))
            left = sum(r.xlen(ks.stream(s)) for s in range(ks.shards))
            blobs = list(r.scan_iter(match="*:blob:*", count=1000))
        finally:
            for w in workers:
                w.terminate(60)
            client.close()
            ok.close()
            r.close()
    p99, base = sampler.result["p99_ms"], baseline.result["p99_ms"]
    control = sampler.result["control"]["p99_ms"]  # the idle server's, PINGed in turn meanwhile
    print(
        f"\n40 x 31 MB outputs: {len(dead)} dead letters in {dead_bytes / 1e6:.2f} MB (counted {counted:,} bytes); "
        f"PING p99 {p99:.1f} ms, worst {sampler.result['worst_ms']:.0f} ms (the same records scored fine: "
        f"p99 {base:.1f} ms, worst {baseline.result['worst_ms']:.0f} ms; idle control meanwhile: p99 {control:.1f} ms; "
        f"ratios {p99 / max(base, 1.0):.2f}x the baseline, {p99 / max(control, 1.0):.2f}x the control); "
        f"slowlog over 5 ms, in all: {', '.join(f'{c} {ms:.0f} ms' for c, ms in sorted(slow.items()))}"
    )
    # Then every key has an error result (and the baseline's a reward), and no record (entry or
    # blob) is left behind
    assert {x.status for x in got.values()} == {"error"} and {x.status for x in fine.values()} == {"ok"}
    assert left == 0 and blobs == []
    # And the dead letters keep only a 64 KiB prefix of each record, saying so, and take a few MB in all
    assert len(dead) >= 30
    cut = [f for f in dead if f.get(b"truncated") == b"1"]
    assert cut and all(len(f[b"data"]) == 64 * 1024 and int(f[b"data_bytes"]) > 30_000_000 for f in cut)
    assert dead_bytes < 5_000_000 and 0 < counted < 5_000_000
    assert 0 < ttl <= 7 * 86400 * 1000
    # And no XADD held Redis (the records came as blobs of 1 MiB pieces), and filing the 8 outputs
    # the trajectory held cost Redis a small share of what putting their pieces did: store keeps a
    # large record by reference instead of copying it through Lua
    assert slow.get("XADD", 0) == 0 and slow.get("store", 0) <= 0.1 * sum(slow.values()), slow
    # And failing and dead-lettering them kept PING's p99 within 2x of the idle control's (the
    # issue's check), and of scoring the same records; a p99 under 2 x FLOOR_MS passes whatever they
    # read: on a quiet 2-core machine both read 1-4 ms, and a single 5 ms command there (one piece's
    # HSET, a script) is scheduling, where the stall this guards against held PING for 80-500 ms
    assert sampler.result["samples"] > 100 and baseline.result["samples"] > 100
    assert p99 <= 2 * max(control, FLOOR_MS), (p99, control)
    assert p99 <= 2 * max(base, FLOOR_MS), (p99, base)


def _slowlog_ms(r: SyncClient) -> dict[str, float]:
    """Milliseconds Redis's slowlog holds per command (``store`` for the store script's EVALSHA)."""
    store = hashlib.sha1(scripts.source("store").encode()).hexdigest()
    out: dict[str, float] = {}
    for e in r.slowlog_get(10_000):
        words = (e["command"] if isinstance(e["command"], bytes) else str(e["command"]).encode()).split(b" ")
        name = "store" if store.encode() in words[:2] else words[0].decode(errors="replace").upper()
        out[name] = out.get(name, 0.0) + e["duration"] / 1000
    return out


#: A marker inside the large record, to prove no message carries record bytes.
MARK = 987_654_321
SAMPLE = {"data_source": "test", "reward_model": {"ground_truth": "0"}}


def _fill(r: SyncClient) -> list[str]:
    """Write filler until Redis refuses a write for memory, then lower its cap 4 MiB under what it
    uses (so that freed client buffers do not bring it back under); the filler's keys."""
    block, keys = b"f" * (1024 * 1024), list[str]()
    for i in range(10_000):
        try:
            r.set(f"filler:{i}", block)
        except redis.exceptions.OutOfMemoryError:
            r.config_set("maxmemory", int(r.info("memory")["used_memory"]) - 4 * 1024 * 1024)
            return keys
        keys.append(f"filler:{i}")
    raise AssertionError("Redis never ran out of memory")


@contextlib.asynccontextmanager
async def _capped_broker(ns: str) -> AsyncIterator[tuple[SyncClient, RewardClient, StreamBroker]]:
    """A throwaway Redis capped at 40 MiB: a plain client, a producer and a worker's broker (groups made)."""
    with RedisServer(extra=["--maxmemory", "40mb", "--maxmemory-policy", "noeviction"]) as srv:
        r = srv.client()
        client = RewardClient.from_url(srv.url, namespace=ns)
        broker = StreamBroker(connect_async(srv.url), client.keyspace, worker=f"w-{ns}")
        try:
            await broker.ensure_groups()
            yield r, client, broker
        finally:
            await broker.r.aclose()
            client.close()
            r.close()


async def test_past_maxmemory_the_producer_is_refused_and_the_worker_still_files_what_it_read() -> None:
    async with _capped_broker("full") as (r, client, broker):
        ks = client.keyspace
        # Given a trajectory of a large record (4 MB: over STORE_INLINE_BYTES) and a small final one, read
        big = {"prompt_ids": np.full(1_000_000, MARK, dtype=np.int32), "response_ids": [1, 2, 3]}
        client.put_output("t", "s", 0, big, SAMPLE)
        client.put_output("t", "s", 1, text_output("fine"), SAMPLE, final=True)
        entries = await broker.read(range(ks.shards), count=10, block_ms=None)
        items = [(e, decode_output(e.data), bytes(e.data)) for e in sorted(entries, key=lambda e: e.id)]
        assert len(items[0][2]) > STORE_INLINE_BYTES > len(items[1][2])
        # When Redis goes past its maxmemory
        filler = _fill(r)
        # Then a producer's write is refused, naming its key and carrying no record bytes
        with pytest.raises(RedisOutOfMemory) as refused:
            client.put_output("u", "s", 0, big, SAMPLE, final=True)
        assert refused.value.keys == ["u_s_0"] and "u_s_0" in str(refused.value)
        assert len(str(refused.value)) < 1000 and MARK.to_bytes(4, "little").decode("latin-1") not in str(refused.value)
        # And the worker still files what it read (store runs past maxmemory): the trajectory is complete,
        # its large record read back from its stream entry, never copied into the hash
        parked, complete = await broker.store(items)
        assert (parked.kind, complete.kind) == ("parked", "complete")
        assert complete.payloads == [items[0][2], items[1][2]]
        traj = ks.traj(ks.shard_of("t_s"), "t_s")
        stream = ks.stream(ks.shard_of("t_s"))
        assert r.hexists(traj, "r:0") and not r.hexists(traj, "o:0") and r.hexists(traj, "o:1")
        assert r.xlen(stream) == 2 and r.xpending(stream, ks.group)["pending"] == 1  # the large one acked, kept
        # And its commit is refused whole until there is room
        results = [RewardResult(key=f"t_s_{i}", status="ok", reward_score=1.0) for i in range(2)]
        with pytest.raises(Exception) as full:
            await broker.commit(ks.shard_of("t_s"), "t_s", results)
        assert is_out_of_memory(full.value), full.value
        # When room comes back, the commit goes through, and the large record's entry ends with its trajectory
        r.delete(*filler)
        assert await broker.commit(ks.shard_of("t_s"), "t_s", results) is True
        answered = client.get_rewards(["t_s_0", "t_s_1"])
        assert {k: x.status if x else None for k, x in answered.items()} == {"t_s_0": "ok", "t_s_1": "ok"}
        assert r.xlen(stream) == 0 and not r.hexists(traj, "r:0") and not r.hexists(traj, "refs")
        # And no blob is left: neither the refused put's (deleted when its piece was refused) nor the
        # large record's (deleted with its trajectory)
        assert list(r.scan_iter(match="full:*:blob:*")) == []


@pytest.mark.slow
def test_results_larger_than_the_whole_cap_become_memory_errors_after_room_wait(tmp_path: Path) -> None:
    # Given a Redis capped at 40 MiB and a worker that waits 3 s for room
    with RedisServer(extra=["--maxmemory", "40mb", "--maxmemory-policy", "noeviction"]) as srv:
        r = srv.client()
        client = RewardClient.from_url(srv.url, namespace="nofit")
        worker = _worker(srv.url, "nofit", tmp_path, room_wait=3)
        try:
            assert worker.wait_for_log(f"worker {worker.name} started", START_WAIT), worker.log()
            # When a trajectory's results take 60 x 900 KiB (54 MB: more than the whole cap), and a small
            # one comes after it
            keys = _trajectory(client, "huge", 60)
            t0 = time.monotonic()
            got = client.wait_rewards(keys, timeout=300)
            took = time.monotonic() - t0
            after = client.wait_rewards(client.put_trajectory("after", "0", [text_output("x")], SAMPLE), timeout=120)
            staged = list(r.scan_iter(match="nofit:*:staged:*", count=1000))
            beat = client.keyspace.worker(worker.name)
            deadline = time.monotonic() + 60
            while int(r.hget(beat, "no_room") or 0) < 1 and time.monotonic() < deadline:
                time.sleep(0.5)  # the next heartbeat publishes the counters
            counters = {k.decode(): v.decode() for k, v in r.hgetall(beat).items()}
        finally:
            worker.terminate(60)
            client.close()
            r.close()
    print(f"\n60 x 900 KiB of results through a 40 MiB Redis: every key answered in {took:.1f}s: {got[keys[0]].error}")
    # Then after about room_wait every key has an error result of kind memory naming the size and the cap
    assert {(x.status, x.failure_kind) for x in got.values()} == {("error", "memory")}
    why = got[keys[0]].error or ""
    assert "no room" in why and "60 keys" in why and "maxmemory 41,943,040 bytes" in why and "room_wait=3s" in why
    # And its staged chunks were dropped, so the next trajectory is scored as usual
    assert not staged and [x.status for x in after.values()] == ["ok"]
    # And the worker's heartbeat counts the write it gave up and the error results by kind
    assert int(counters["no_room"]) >= 1 and json.loads(counters["failures"]) == {"test": {"memory": 1}}, counters


async def test_past_maxmemory_the_workers_bookkeeping_still_goes_through() -> None:
    async with _capped_broker("book") as (r, client, broker):
        ks = client.keyspace
        client.put_trajectory("t", "s", [text_output("a"), text_output("b")], SAMPLE)
        entries = sorted(await broker.read(range(ks.shards), count=10, block_ms=None), key=lambda e: e.id)
        shard = ks.shard_of("t_s")
        # Given a Redis past its maxmemory, where a plain write of a few bytes is refused
        filler = _fill(r)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            r.hset("probe", "f", "v")
        # When the worker leases a trajectory read whole, renews it, records an unfinished attempt
        # and a start in a scorer, beats, and takes, renews and gives back the stage lease
        assert await broker.claim_whole([(shard, "t_s", entries)]) == [True]
        assert await broker.liveness.renew({shard: ["t_s"]}) == 1
        await broker.attempts.note_unfinished(shard, "t_s", "a commit Redis refused")
        assert await broker.attempts.start_shared(shard, "t_s") == 1
        await broker.liveness.heartbeat({"read": 2, "note": "x" * 2000}, ttl=30)
        assert (await broker.stage_lease(shard, "take", "tok", prefix="p:", staged=2))[0]
        assert (await broker.stage_lease(shard, "renew", "tok", prefix="p:", staged=3))[0]
        assert (await broker.stage_lease(shard, "release", "tok"))[0]
        # Then every one went through: they are small, and refusing them would make a live worker
        # look dead or leave a full Redis no way to drain
        assert r.hget(ks.traj(shard, "t_s"), "unfinished") == b"1"
        assert r.hget(ks.worker("w-book"), "read") == b"2" and r.zscore(ks.workers, "w-book") is not None
        assert not r.exists(ks.stage_lease(0))
        r.delete(*filler)
