"""Trajectories that expire (``incomplete_timeout``) have ledger rows, on the real Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from rewardq import FailureKind, RewardClient
from rewardq.ledger.read import read_table
from rewardq.queue.broker import StreamBroker
from rewardq.queue.connection import connect_async
from rewardq.queue.keys import Keyspace
from tests.support.helpers import LEDGER_STOP_GRACE, open_test_worker, output, running_worker, until, worker_config
from tests.support.ledger_checks import assert_row_is_its_result
from tests.support.sync_client import SyncClient

SAMPLE: dict[str, Any] = {
    "data_source": "openai/gsm8k",
    "reward_model": {"ground_truth": "7", "style": "rule"},
    "extra_info": {"split": "train", "index": 4},
}


async def test_an_expired_trajectory_has_a_row_per_key_with_the_outputs_that_arrived(
    ns: str, redis_url: str, tmp_path: Path
) -> None:
    # Given a trajectory whose outputs 0 and 2 (the final one) arrived but not output 1,
    # and another whose final output never came
    client = RewardClient.from_url(redis_url, namespace=ns)
    outs = {i: output(3 + i, 5 + i, seed=i) for i in (0, 2)}
    client.put_output("gap", "s", 0, outs[0], SAMPLE)
    client.put_output("gap", "s", 2, outs[2], SAMPLE, final=True)
    client.put_output("nofinal", "s", 0, output(4, 4, seed=9), {**SAMPLE, "data_source": "lighteval/MATH"})
    keys = ["gap_s_0", "gap_s_1", "gap_s_2", "nofinal_s_0"]
    ledger = str(tmp_path / "ledger")
    # When a worker with a ledger ends them after incomplete_timeout, then stops
    cfg = worker_config(ns, redis_url, ledger=ledger, incomplete_timeout=0.5, shutdown_grace=LEDGER_STOP_GRACE)
    async with running_worker(cfg) as w:
        results = await asyncio.to_thread(client.wait_rewards, keys, 20)
    client.close()
    # Then every key has one row saying what its result says
    rows = {r["key"]: r for r in read_table(ledger).to_pylist()}
    assert set(rows) == set(keys)
    for key, res in results.items():
        row = rows[key]
        assert res.status == row["status"] == "error" and res.failure_kind == FailureKind.INPUT, key
        assert row["failure_kind"] == "input" and row["error"] == res.error and row["worker"] == w.name
        assert row["reward_score"] is None and row["committed"] is True
        assert_row_is_its_result(row, res)  # never scored: attempt 0, no provenance, scorer nor manager
        assert row["attempt"] == 0 and row["provenance"] is None and row["manager"] is None
        # its latency: from the last output filed to the result, at least incomplete_timeout
        assert res.latency_ms is not None and res.latency_ms >= 500 and row["latency_ms"] == res.latency_ms
    assert "missing output indices 1 of 0..2" in (rows["gap_s_1"]["error"] or "")
    assert "final output never arrived" in (rows["nofinal_s_0"]["error"] or "")
    # And the rows of the outputs that arrived hold their ids and the sample; the missing one only its identity
    for i, o in outs.items():
        row = rows[f"gap_s_{i}"]
        assert np.frombuffer(row["response_ids"], "<i4").tolist() == list(o["response_ids"])
        assert np.frombuffer(row["prompt_ids"], "<i4").tolist() == list(o["prompt_ids"])
    assert rows["gap_s_1"]["response_ids"] == b"" and rows["gap_s_1"]["index"] == 1
    assert [rows[f"gap_s_{i}"]["final"] for i in range(3)] == [False, False, True]
    assert {rows[k]["data_source"] for k in keys[:3]} == {"openai/gsm8k"}
    assert rows["nofinal_s_0"]["data_source"] == "lighteval/MATH"
    assert rows["gap_s_0"]["ground_truth"] == '"7"' and rows["gap_s_0"]["outputs"] == 3


async def test_the_expire_script_returns_records_only_when_asked_and_within_its_byte_budget(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    # Given three incomplete trajectories stored by a worker, each with one record
    client = RewardClient.from_url(redis_url, namespace=ns)
    for t in "abc":
        client.put_output(t, "s", 0, output(200, 300, seed=1), SAMPLE)
    client.close()
    ks = Keyspace(ns)
    w = await open_test_worker(worker_config(ns, redis_url, incomplete_timeout=600.0))
    task = asyncio.create_task(w.run())
    try:
        await until(lambda: all(sync_redis.hget(ks.traj(0, t + "_s"), "stored") for t in "abc"), "3 stored", 15)
    finally:
        w.request_stop("test done")
        await task
    for t in "abc":  # due now
        sync_redis.zadd(ks.waiting(0), {t + "_s": 0})
    size = int(sync_redis.hget(ks.traj(0, "a_s"), "bytes") or 0)
    aclient = connect_async(redis_url)
    broker = StreamBroker(aclient, ks, worker="t", incomplete_timeout=1.0)
    try:
        # When the script runs with a budget of two trajectories' records, then without records
        first = await broker.expire_incomplete(0, records_bytes=2 * size)
        rest = await broker.expire_incomplete(0)
    finally:
        await aclient.aclose()
    # Then the first call ends two trajectories, with their records; the second ends the third without
    assert size > 2000
    assert [(e.tid, e.keys, [len(r or b"") for r in e.records]) for e in first] == [
        ("a_s", 1, [size]),
        ("b_s", 1, [size]),
    ]
    assert [(e.tid, e.keys, e.records) for e in rest] == [("c_s", 1, [])]
