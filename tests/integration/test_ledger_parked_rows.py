"""A failure at intake reads its trajectory's parked records back for its ledger rows, on the real
Redis (and a real cluster) with real workers (docs/ledger.md, "Refused records too"): when an output
that does not decode comes after outputs stored earlier (by an earlier batch, or by another worker),
every row of the failure has the trajectory's sample and each parked key its own ids. A parked record
that does not decode is not used; a read Redis fails leaves the rows without them, and the failure
goes on. The read itself is bounded (:mod:`rewardq.queue.parked`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from rewardq import RewardClient
from rewardq.ledger.read import read_table
from rewardq.queue.blobs import BLOB_CHUNK_BYTES
from rewardq.queue.broker import StreamBroker
from rewardq.queue.codec import decode_output
from rewardq.queue.connection import connect_async
from rewardq.queue.keys import Keyspace
from rewardq.queue.parked import parked_records
from rewardq.queue.results import RewardResult
from tests.support.cluster import LocalCluster
from tests.support.helpers import output, running_worker, until, worker_config
from tests.support.ledger_checks import assert_row_is_its_result
from tests.support.ledger_rewards import CUSTOM
from tests.support.ledger_workload import REWARDS
from tests.support.sync_client import SyncClient

SAMPLE: dict[str, Any] = {"data_source": CUSTOM, "reward_model": {"ground_truth": "a"}, "extra_info": {"n": 7}}
JUNK = b"\xc1\xc1 not msgpack"


def _out(i: int) -> dict[str, Any]:
    return output(3, 4, seed=i)


def _ids(raw: bytes | None) -> list[int]:
    ids: list[int] = np.frombuffer(raw or b"", "<i4").tolist()
    return ids


def _rows(ledger: str, results: dict[str, RewardResult | None]) -> dict[str, dict[str, Any]]:
    """The ledger's rows after its dedup, one per key of ``results``, each saying what Redis says."""
    rows = {r["key"]: r for r in read_table(ledger).to_pylist()}
    assert set(rows) == set(results), (sorted(rows), sorted(results))
    for key, res in results.items():
        assert res is not None and res.status == "error" and res.failure_kind == "input", key
        assert_row_is_its_result(rows[key], res)
    return rows


def _assert_sampled(rows: dict[str, dict[str, Any]]) -> None:
    """Every row has the trajectory's sample."""
    for key, row in rows.items():
        assert (row["data_source"], row["ground_truth"], row["extra_info"]) == (CUSTOM, '"a"', '{"n":7}'), key


def _assert_ids(rows: dict[str, dict[str, Any]], with_ids: Sequence[int], tid: str = "u_s") -> None:
    """The keys of ``with_ids`` have their own output's ids; every other key none."""
    for key, row in rows.items():
        i = int(key.rsplit("_", 1)[1])
        if i in with_ids:
            want = _out(i)
            assert _ids(row["prompt_ids"]) == want["prompt_ids"].tolist(), key
            assert _ids(row["response_ids"]) == want["response_ids"].tolist(), key
            assert row["response_length"] == 4, key
        else:
            assert _ids(row["prompt_ids"]) == [] and _ids(row["response_ids"]) == [], key


async def _after_another_worker(
    url: str,
    ns: str,
    ledger: str,
    r: Any,
    outputs: dict[int, dict[str, Any]],
    final: int,
    junk: int,
    conflict: bool = False,
) -> dict[str, Any]:
    """Another worker (a broker of its own) reads ``outputs`` of trajectory ``u_s`` (``final``: the
    final one's index, -1: none) and parks each in its hash; then its output ``junk`` arrives and
    does not decode (``conflict``: decodes, with other ids and no sample), and a worker with a
    ledger reads it. Returns the results of keys 0 up to the highest index."""
    ks = Keyspace(ns)
    client = RewardClient.from_url(url, namespace=ns)
    for i, out in outputs.items():
        client.put_output("u", "s", i, out, SAMPLE, final=i == final)
    a = connect_async(url)
    try:
        other = StreamBroker(a, ks, worker="other")
        await other.ensure_groups()
        entries = await other.read([0], 100, None)
        stored = await other.store([(e, decode_output(e.data), bytes(e.data)) for e in entries])
        assert [o.kind for o in stored] == ["parked"] * len(outputs)
    finally:
        await a.aclose()
    if conflict:
        client.put_output("u", "s", junk, _out(99), {}, final=False)
    else:
        _junk(r, ks, f"u_s_{junk}")
    keys = [f"u_s_{i}" for i in range(max(junk, *outputs) + 1)]
    async with running_worker(worker_config(ns, url, reward_fn=REWARDS, ledger=ledger)):
        results = await asyncio.to_thread(client.wait_rewards, keys, 30)
    client.close()
    return dict(results)


def _junk(r: Any, ks: Keyspace, key: str) -> None:
    r.xadd(ks.stream(0), {"key": key, "data": JUNK, "ts": f"{time.time():.6f}"})


async def _after_an_earlier_batch(url: str, ns: str, ledger: str, r: Any, parked: Any = None) -> dict[str, Any]:
    """A worker with a ledger stores outputs 0 and 1 of trajectory ``u_s`` (parked, in its hash); then
    its output 2 arrives in a later batch and does not decode. Returns the results of keys 0 to 2
    (``r``: a blocking client of ``url``; ``parked``: stands in for the worker's read of parked records)."""
    ks = Keyspace(ns)
    client = RewardClient.from_url(url, namespace=ns)
    for i in (0, 1):
        client.put_output("u", "s", i, _out(i), SAMPLE)
    async with running_worker(worker_config(ns, url, reward_fn=REWARDS, ledger=ledger)) as w:
        if parked is not None:
            setattr(w.broker, "parked", parked)  # noqa: B010 - a method replaced on this one broker
        await until(lambda: r.hget(ks.traj(0, "u_s"), "stored") == b"2", "outputs 0, 1 parked", 30)
        _junk(r, ks, "u_s_2")
        results = await asyncio.to_thread(client.wait_rewards, [f"u_s_{i}" for i in range(3)], 30)
    client.close()
    return dict(results)


async def test_an_undecodable_output_after_outputs_an_earlier_batch_stored_has_their_sample_and_ids(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given a worker with a ledger that stored outputs 0 and 1 of a trajectory (in its hash, parked)
    # When its output 2 arrives in a later batch and does not decode
    ledger = str(tmp_path / "ledger")
    results = await _after_an_earlier_batch(redis_url, ns, ledger, sync_redis)
    # Then every key has its error result and its row, each row with the trajectory's sample
    rows = _rows(ledger, results)
    _assert_sampled(rows)
    # ... the parked keys with their own ids, the undecodable one's with none
    _assert_ids(rows, with_ids=[0, 1])
    assert all(row["committed"] is True for row in rows.values())


async def test_an_undecodable_output_after_outputs_another_worker_parked_has_their_sample_and_ids(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given outputs 0 and 3 (the final one) of a trajectory that another worker stored
    # When its output 1 arrives and does not decode, and a worker with a ledger reads it
    ledger = str(tmp_path / "ledger")
    results = await _after_another_worker(redis_url, ns, ledger, sync_redis, {0: _out(0), 3: _out(3)}, 3, junk=1)
    # Then every key up to the final one has its row with the trajectory's sample (key 3, past the
    # one the refused entry names, too: the fail script wrote it)
    rows = _rows(ledger, results)
    _assert_sampled(rows)
    # ... the keys the other worker parked with their own ids; 1 (undecodable) and 2 (never came) none
    _assert_ids(rows, with_ids=[0, 3])
    assert [k for k, row in sorted(rows.items()) if row["final"]] == ["u_s_3"]


async def test_a_conflicting_record_without_a_sample_takes_the_parked_records_sample(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given outputs 0 and 1 of a trajectory that another worker stored
    # When a record for output 0 with other ids and no sample arrives (a conflict)
    ledger = str(tmp_path / "ledger")
    results = await _after_another_worker(
        redis_url, ns, ledger, sync_redis, {0: _out(0), 1: _out(1)}, -1, junk=0, conflict=True
    )
    # Then the rows have the parked records' sample, not the refused record's empty one
    rows = _rows(ledger, results)
    _assert_sampled(rows)


async def test_a_parked_record_that_does_not_decode_leaves_the_others_rows_whole(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given outputs 0, 1 and 2 of a trajectory another worker parked, of which output 0 does not
    # decode with this worker's decoder (a token id past its tokenizer's vocabulary)
    # When its output 3 arrives and does not decode
    ledger = str(tmp_path / "ledger")
    outputs = {0: {**_out(0), "response_ids": np.array([1, 2, 10**6])}, 1: _out(1), 2: _out(2)}
    results = await _after_another_worker(redis_url, ns, ledger, sync_redis, outputs, -1, junk=3)
    # Then every row has the sample of the first record that decodes, the parked keys that decode
    # their ids, and output 0's key none
    rows = _rows(ledger, results)
    _assert_sampled(rows)
    _assert_ids(rows, with_ids=[1, 2])


async def test_a_failed_read_of_the_parked_records_leaves_the_rows_as_the_batch_makes_them(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a worker with a ledger that stored outputs 0 and 1 of a trajectory, whose read of
    # parked records Redis fails
    calls: list[str] = []

    async def refused(shard: int, tid: str, skip: object = ()) -> dict[int, bytes]:
        calls.append(tid)
        raise RedisConnectionError("Connection reset by peer")

    caplog.set_level(logging.WARNING, logger="rewardq.worker")
    # When its output 2 arrives and does not decode
    ledger = str(tmp_path / "ledger")
    results = await _after_an_earlier_batch(redis_url, ns, ledger, sync_redis, parked=refused)
    # Then the failure went on: every key has its error result, the trajectory its dead letter
    assert calls == ["u_s"]
    assert [f[b"key"] for _, f in sync_redis.xrange(Keyspace(ns).dead(0))] == [b"u_s_2"]
    # ... and its rows, as the failing batch alone makes them: no sample, no ids
    rows = _rows(ledger, results)
    assert [(r["data_source"], _ids(r["response_ids"])) for r in rows.values()] == [(None, [])] * 3
    # ... with one warning naming the trajectory
    said = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(said) == 1 and "u_s" in said[0], said


async def test_a_failure_on_a_cluster_reads_the_parked_records_from_its_trajectorys_node(
    redis_cluster: LocalCluster, cns: str, tmp_path: Path, rc: Any
) -> None:
    # Given a worker with a ledger on a Redis Cluster that stored outputs 0 and 1 of a trajectory
    # When its output 2 arrives and does not decode
    ledger = str(tmp_path / "ledger")
    results = await _after_an_earlier_batch(redis_cluster.url, cns, ledger, rc)
    # Then every row has the sample, and the parked keys their ids
    rows = _rows(ledger, results)
    _assert_sampled(rows)
    _assert_ids(rows, with_ids=[0, 1])


async def test_the_read_is_bounded_by_fields_bytes_and_command_size(ns: str, redis_url: str) -> None:
    # Given a trajectory hash holding 10 records inline (o:<i>): four of 0.4 piece each, then six
    # of 100 bytes; and one kept by reference (r:10)
    traj = Keyspace(ns).traj(0, "u_s")
    big = int(BLOB_CHUNK_BYTES * 0.4)
    fields: dict[str, Any] = {f"o:{i}": bytes([i]) * (big if i < 4 else 100) for i in range(10)}
    fields.update({"r:10": "1-0", "hi": 10, "stored": 11, "refs": 1})
    r = connect_async(redis_url)
    asked: list[int] = []
    real = r.hmget

    async def counting(name: str, keys: list[str]) -> Any:
        asked.append(len(keys))
        return await real(name, keys)  # type: ignore[misc]  # see rewardq.queue.clients

    setattr(r, "hmget", counting)  # noqa: B010 - a method replaced on this one client
    try:
        await r.hset(traj, mapping=fields)  # type: ignore[misc]  # see rewardq.queue.clients
        # Then every inline record is read but those skipped; the one by reference is not
        got = await parked_records(r, traj, max_outputs=4096, skip={3})
        assert sorted(got) == [0, 1, 2, 4, 5, 6, 7, 8, 9] and got[5] == bytes([5]) * 100
        # ... in commands of at most a piece each, packed by each record's own length, after one
        # for its counts: 0 and 1 (0.8 piece), then 2 and the six small ones
        assert asked == [4, 2, 7]
        # ... at most max_outputs fields
        assert sorted(await parked_records(r, traj, max_outputs=4)) == [0, 1, 2, 3]
        # ... at most max_bytes bytes, the lowest indexes first, and nothing past them asked for
        asked.clear()
        assert sorted(await parked_records(r, traj, max_outputs=4096, max_bytes=2 * big + 50)) == [0, 1]
        assert asked == [4, 2]
        # ... and a finished trajectory, one with nothing inline, or no hash, costs one command
        asked.clear()
        await r.hset(traj, "state", "done")  # type: ignore[misc]  # see rewardq.queue.clients
        assert await parked_records(r, traj, max_outputs=4096) == {}
        await r.hset(traj, mapping={"state": "collecting", "refs": "11"})  # type: ignore[misc]  # see rewardq.queue.clients
        assert await parked_records(r, traj, max_outputs=4096) == {}
        assert await parked_records(r, traj + "-gone", max_outputs=4096) == {}
        assert asked == [4, 4, 4]
    finally:
        await r.delete(traj)
        await r.aclose()
