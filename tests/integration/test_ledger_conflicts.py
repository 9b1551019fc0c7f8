"""Ledger rows of keys the intake refuses, on the real Redis with a real worker: a record that comes
after its trajectory finished adds no row that contradicts the key's result (docs/failures.md,
docs/ledger.md); a trajectory read whole past ``max_trajectory_bytes`` has a row per key."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import numpy as np

from rewardq import RewardClient
from rewardq.demo.data import make_trajectories
from rewardq.ledger.read import read_table
from rewardq.ledger.replay import plan
from rewardq.ledger.report import trajectory_rows
from rewardq.queue.codec import encode_output
from rewardq.queue.keys import Keyspace
from tests.support.helpers import LEDGER_STOP_GRACE, running_worker, until, worker_config
from tests.support.ledger_checks import assert_row_is_its_result
from tests.support.sync_client import SyncClient


async def test_a_late_conflicting_record_adds_no_row_that_outranks_the_keys_result(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given a trajectory of 3+ outputs scored by a worker with a ledger
    t = next(t for t in make_trajectories(20, seed=4) if len(t["outputs"]) >= 3)
    uid, sid, n = t["uid"], t["session_id"], len(t["outputs"])
    client = RewardClient.from_url(redis_url, namespace=ns)
    ledger = str(tmp_path / "ledger")
    late = f"{uid}_{sid}_{n}"
    async with running_worker(worker_config(ns, redis_url, ledger=ledger, shutdown_grace=LEDGER_STOP_GRACE)):
        keys = client.put_trajectory(uid, sid, t["outputs"], t["sample"])
        first = await asyncio.to_thread(client.wait_rewards, keys, 60)
        assert all(r.ok for r in first.values())
        # When output 1 is put again with one token fewer, and an output past the final one arrives
        changed = dict(t["outputs"][1], response_ids=t["outputs"][1]["response_ids"][:-1])
        changed.pop("response_mask", None)
        changed.pop("response_logprobs", None)
        client.put_output(uid, sid, 1, changed, t["sample"])
        client.put_output(uid, sid, n, t["outputs"][0], t["sample"], final=True)  # saying it is the final one
        dead = Keyspace(ns).dead(0)
        await until(lambda: sync_redis.xlen(dead) == 2, "two conflict dead letters", timeout=30)
        await until(lambda: client.get_rewards([late])[late] is not None, "the late key's error", timeout=30)
    results = client.get_rewards([*keys, late])
    client.close()
    # Then Redis keeps the results of the finished trajectory, and the late key got an error
    assert all(r is not None and r.ok for r in (results[k] for k in keys))
    late_result = results[late]
    assert late_result is not None and late_result.status == "error" and late_result.failure_kind == "input"
    # And the ledger has no row for the conflict on a key that kept its result: one row per key
    raw = read_table(ledger, dedup=False).to_pylist()
    assert sorted(r["key"] for r in raw) == sorted([*keys, late])
    # ... the late key's row says what its error result says (never scored: attempt 0, no provenance)
    for row in raw:
        res = results[row["key"]]
        assert res is not None
        assert_row_is_its_result(row, res)
    # ... the late key's row is never its trajectory's final row, so the report and a replay still
    # see the trajectory as scored, whole and ok
    assert [r["key"] for r in raw if r["final"]] == [keys[-1]]
    [row] = trajectory_rows(read_table(ledger).to_pylist())
    assert (row["key"], row["status"]) == (keys[-1], "ok")
    replayed = plan(ledger)
    assert replayed.incomplete == 0 and [t.keys for t in replayed.trajectories] == [keys]
    # ... and the documented DuckDB dedup gives every key Redis's status
    files = f"{ledger}/**/*.parquet"
    deduped = (
        duckdb.connect()
        .sql(
            f"""SELECT key, status FROM read_parquet('{files}', hive_partitioning = true)
            QUALIFY row_number() OVER (PARTITION BY key
                ORDER BY committed IS NOT DISTINCT FROM false, attempt DESC, scored_at DESC) = 1"""
        )
        .fetchall()
    )
    assert dict(deduped) == {k: str(r.status) for k, r in results.items() if r is not None}


async def test_a_trajectory_read_whole_past_max_trajectory_bytes_has_a_row_per_key(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given a trajectory of 4 records of ~300 KB, read in one batch, past a 1 MiB max_trajectory_bytes
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    _ = client.keyspace  # the namespace, as a producer makes it
    sample = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "7"}}
    n, big = 4, 75_000
    pipe = sync_redis.pipeline(transaction=True)
    for i in range(n):
        out = {"prompt_ids": np.full(big, 7, dtype=np.int32), "response_ids": [1, 2]}
        data = encode_output("big", "s", i, out, sample, final=i == n - 1)
        pipe.xadd(ks.stream(0), {"key": f"big_s_{i}", "data": data})
    pipe.execute()
    keys = [f"big_s_{i}" for i in range(n)]
    ledger = str(tmp_path / "ledger")
    # When a worker with a ledger refuses it
    cfg = worker_config(ns, redis_url, ledger=ledger, max_record_bytes=1 << 19, max_trajectory_bytes=1 << 20)
    async with running_worker(cfg):
        results = await asyncio.to_thread(client.wait_rewards, keys, 30)
    client.close()
    # Then every key got its error result, and has its row saying so
    assert all("max_trajectory_bytes" in (r.error or "") for r in results.values())
    rows = {r["key"]: r for r in read_table(ledger).to_pylist()}
    assert set(rows) == set(keys)
    for key, res in results.items():
        assert_row_is_its_result(rows[key], res)
        assert rows[key]["committed"] is True and rows[key]["data_source"] == "openai/gsm8k"
