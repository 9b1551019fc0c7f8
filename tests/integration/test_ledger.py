"""The reward ledger written by real workers on the real Redis: rows, provenance, failures."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from rewardq import RewardClient
from rewardq.consumers.worker import Worker
from rewardq.ledger.read import read_table
from rewardq.ledger.schema import COLUMN_NAMES, arrow_schema
from rewardq.ledger.table import sample_of
from rewardq.queue.keys import Keyspace
from rewardq.queue.provenance import lookup
from rewardq.reward.tokenizer import load_tokenizer
from tests.support.helpers import LEDGER_STOP_GRACE, open_test_worker, until, worker_config
from tests.support.ledger_checks import assert_row_is_its_result
from tests.support.ledger_facts import damaged_segment
from tests.support.ledger_rewards import CUSTOM, FAILING
from tests.support.ledger_workload import REWARDS, mixed_trajectories, push_all
from tests.support.sync_client import SyncClient


async def _score_all(ns: str, url: str, trajs: list[dict[str, Any]], **kw: Any) -> tuple[dict[str, Any], Worker]:
    client = RewardClient.from_url(url, namespace=ns)
    keys = push_all(client, trajs)
    w = await open_test_worker(worker_config(ns, url, reward_fn=REWARDS, shutdown_grace=LEDGER_STOP_GRACE, **kw))
    task = asyncio.create_task(w.run())
    try:
        got: dict[str, Any] = {}

        def all_done() -> bool:
            got.update({k: v for k, v in client.get_rewards(keys).items() if v is not None})
            return len(got) == len(keys)

        await until(all_done, "every key's result", timeout=90, poll=0.2)
    finally:
        w.request_stop("test done")
        await task
        client.close()
    return got, w


async def test_every_key_has_one_row_matching_its_result(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given mixed trajectories (GSM8K, MATH, a custom data source, some that fail)
    trajs = mixed_trajectories(60, seed=3)
    ledger = str(tmp_path / "ledger")
    # When a worker with a ledger scores them and stops
    results, w = await _score_all(ns, redis_url, trajs, ledger=ledger)
    # Then the ledger has one row per key, and its reward, status and provenance are the result's
    table = read_table(ledger)
    assert table.schema.names == list(COLUMN_NAMES)
    rows = {r["key"]: r for r in table.to_pylist()}
    assert set(rows) == set(results)
    for key, res in results.items():
        row = rows[key]
        assert row["status"] == res.status and row["reward_score"] == res.reward_score, key
        assert len(row["provenance"]) == 16 and row["attempt"] == 1 and row["committed"] is True
        assert row["provenance"] == res.provenance and res.attempt == 1  # error results too
        assert row["failure_kind"] == res.failure_kind  # scorer, for the reward function that raised
        assert json.loads(row["reward_extra_info"]) == res.reward_extra_info
        assert row["worker"] == res.worker == w.name
        assert_row_is_its_result(row, res)
    by_ds = {t["sample"]["data_source"] for t in trajs}
    assert {CUSTOM, FAILING, "openai/gsm8k", "lighteval/MATH"} <= by_ds
    # And each output's ids, mask and sample are the ones pushed; the final row holds the decoded response
    tok = load_tokenizer("builtin:demo")
    for t in trajs:
        n = len(t["outputs"])
        for i, o in enumerate(t["outputs"]):
            row = rows[f"{t['uid']}_{t['session_id']}_{i}"]
            assert np.frombuffer(row["response_ids"], "<i4").tolist() == o["response_ids"]
            assert np.frombuffer(row["prompt_ids"], "<i4").tolist() == o["prompt_ids"]
            assert np.frombuffer(row["response_mask"], "u1").tolist() == o["response_mask"]
            assert row["final"] == (i == n - 1) and row["outputs"] == n
            assert sample_of(row["data_source"], row["ground_truth"], row["extra_info"], row["sample"]) == t["sample"]
        final = rows[f"{t['uid']}_{t['session_id']}_{n - 1}"]
        if final["status"] == "ok":
            assert final["response"] == tok.decode(t["outputs"][-1]["response_ids"], skip_special_tokens=True)
            assert final["score_ms"] > 0 and final["latency_ms"] > 0
        else:
            assert t["sample"]["data_source"] == FAILING and "no score for" in final["error"]
            # the reward function raised after the response was decoded: the row keeps it, and the time
            assert final["response"] == tok.decode(t["outputs"][-1]["response_ids"], skip_special_tokens=True)
            assert final["score_ms"] > 0
            # an error result has its latency too, from the same put; the row is spooled just before it
            latency = results[final["key"]].latency_ms
            assert latency is not None and 0 <= final["latency_ms"] <= latency + 0.01
    # And the provenance blob each result names is in Redis, saying which scorer ran
    named = {r.provenance for r in results.values()}
    blobs = lookup(sync_redis, Keyspace(ns), sorted(named))
    assert len(named) == 1 and set(blobs) == named  # one reward function: one blob, published
    blob = blobs[named.pop()]
    assert blob["scorer"].startswith("reward_fn:ledger_rewards.py:compute_score@sha256=")
    assert blob["scoring"] == w.presence.scoring and blob["manager"] == "naive" and blob["rewardq_version"]
    # And `rewardq inspect` shows it, the blob resolved
    from rich.console import Console

    from rewardq.ops.inspect import inspect_view, render_inspect

    key = next(iter(results))
    view = inspect_view(sync_redis, Keyspace(ns), key)
    assert view["provenance"] == blobs and view["outputs"][0]["result"]["attempt"] == 1
    console = Console(width=200, record=True)
    console.print(render_inspect(view, console=console))
    shown = console.export_text()
    assert f"provenance {results[key].provenance}" in shown and "scorer=reward_fn:ledger_rewards.py" in shown
    # And the files carry the documented schema and the version
    files = sorted(Path(ledger).rglob("*.parquet"))
    assert files and all(pq.read_schema(f).equals(arrow_schema(), check_metadata=True) for f in files)
    assert all(f.parent.name.startswith("hour=") and f.parent.parent.name.startswith("date=") for f in files)
    # And nothing is left in the spool, not even the worker's lock file
    assert not list(Path(ledger).rglob("*.wal")) and not list(Path(ledger).rglob("*.lock"))
    snap = w.accounting.snapshot() if w.accounting else None
    assert snap is not None and snap["unwritten"] == 0 and snap["rows"] == len(results) and snap["state"] == "ok"


async def test_a_ledger_that_cannot_be_written_never_stops_scoring_and_says_so(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    from rewardq.ops.diagnosis import diagnose
    from rewardq.ops.overview import pipeline_status

    # Given a ledger whose destination refuses every file (its folder is a file: a bucket gone)
    blocker = tmp_path / "gone"
    blocker.write_text("not a folder")
    trajs = [t for t in mixed_trajectories(30, seed=5) if t["sample"]["data_source"] != FAILING]
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = push_all(client, trajs)
    w = await open_test_worker(
        worker_config(
            ns, redis_url, reward_fn=REWARDS, ledger=str(blocker / "ledger"), ledger_spool=str(tmp_path / "spool")
        )
    )
    task = asyncio.create_task(w.run())
    try:
        # When it scores (and tries to flush)
        await until(lambda: all(v is not None for v in client.get_rewards(keys).values()), "results", timeout=60)
        assert all(v is not None and v.ok for v in client.get_rewards(keys).values())
        assert w.accounting.ledger is not None
        await w.accounting.ledger.flush_due(everything=True)
        await w.beat()
        # Then every trajectory is scored, and status says the ledger is failing, naming why
        st = pipeline_status(sync_redis, Keyspace(ns))
        ledger = st["ledger"]
        assert ledger["failing"] and "cannot write" in ledger["failing"][w.name] and ledger["rows"] == 0
        # (and the live reward health: every trajectory counted under its data source, nothing jumped)
        health = {r["data_source"]: r for r in st["reward_health"]}
        assert sum(r["trajectories"] for r in health.values()) == len(trajs)
        assert set(health) == {t["sample"]["data_source"] for t in trajs}
        assert all(not r["jumps"] and r["error_share"] == 0.0 for r in health.values())
        st["diagnosis"] = diagnose(st)
        assert any(d["level"] == "error" and "ledger is not being written" in d["message"] for d in st["diagnosis"])
        # And once the destination is back, the spooled trajectories are written
        blocker.unlink()
        w.accounting.ledger._retry_at = 0.0  # skip the backoff's wait
        await w.accounting.ledger.flush_due(everything=True)
        assert w.accounting.ledger.snapshot()["state"] == "ok"
    finally:
        w.request_stop("test done")
        await task
        client.close()
    assert set(read_table(str(blocker / "ledger"))["key"].to_pylist()) == set(keys)


async def test_spooled_frames_a_worker_cannot_read_show_in_status_metrics_and_diagnosis(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    from rewardq.consumers.metrics import WorkerMetrics
    from rewardq.ops.diagnosis import diagnose
    from rewardq.ops.overview import pipeline_status
    from rewardq.ops.status_view import ledger_line

    # Given a dead worker's segment in the spool with a damaged trajectory frame, a frame of an
    # unknown kind and a torn last frame
    spool = tmp_path / "spool"
    spool.mkdir()
    damaged_segment(spool / "dead.0000000001.wal")
    metrics = WorkerMetrics("naive")
    cfg = worker_config(ns, redis_url, reward_fn=REWARDS, ledger=str(tmp_path / "ledger"), ledger_spool=str(spool))
    w = await open_test_worker(cfg, metrics=metrics)
    task = asyncio.create_task(w.run())
    try:
        # When the worker adopts and writes it
        ledger = w.accounting.ledger
        assert ledger is not None
        await until(lambda: ledger.counts["adopted"] == 1, "the dead worker's segment written", timeout=30)
        await w.beat()
        # Then status, its ledger line, its diagnosis and the metrics count the two unreadable frames
        st = pipeline_status(sync_redis, Keyspace(ns))
        assert (st["ledger"]["rows"], st["ledger"]["unreadable"], st["ledger"]["failing"]) == (4, 2, {})
        assert "2 spooled frames unreadable" in ledger_line(st["ledger"])
        said = [d["message"] for d in diagnose(st) if d["level"] == "error"]
        assert any("2 spooled frames could not be read back" in m for m in said)
        assert metrics.registry.get_sample_value("rewardq_ledger_unreadable_total") == 2
    finally:
        w.request_stop("test done")
        await task
    assert [p.name for p in spool.glob("dead.*")] == ["dead.0000000001.wal.unreadable"]


async def test_keys_the_intake_dead_letters_have_rows_too(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given a record that does not decode, and an entry delivered more often than max_deliveries
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    out = [{"prompt_ids": [1, 2], "response_ids": [3, 4]}]
    sample = {"data_source": CUSTOM, "reward_model": {"ground_truth": "a"}}
    (good,) = client.put_trajectory("fine", "s", out, sample)
    sync_redis.xadd(ks.stream(0), {"key": "junk_s_0", "data": b"\x00garbage", "ts": "0"})
    (tired,) = client.put_trajectory("tired", "s", out, sample)
    with contextlib.suppress(Exception):  # the group exists once a producer or worker made it
        sync_redis.xgroup_create(ks.stream(0), ks.group, id="0")
    entries = sync_redis.xreadgroup(ks.group, "ghost", {ks.stream(0): ">"})
    for _, items in entries:  # a dead consumer held them all; the tired one was delivered 9 times
        for eid, fields in items:
            retry = ["RETRYCOUNT", 9] if fields[b"key"] == tired.encode() else []
            sync_redis.execute_command("XCLAIM", ks.stream(0), ks.group, "ghost", 0, eid, "IDLE", 600_000, *retry)
    ledger = str(tmp_path / "ledger")
    # When a worker with a ledger takes them (its reclaim finds all three) and stops
    w = await open_test_worker(
        worker_config(ns, redis_url, reward_fn=REWARDS, ledger=ledger, max_deliveries=3, claim_idle=0.5)
    )
    task = asyncio.create_task(w.run())
    keys = [good, "junk_s_0", tired]
    try:
        await until(lambda: all(client.get_rewards(keys).values()), "three results", timeout=60)
    finally:
        w.request_stop("test done")
        await task
    res = {k: v for k, v in client.get_rewards(keys).items() if v is not None}
    assert res["junk_s_0"].status == "error" and res["junk_s_0"].failure_kind == "input"
    assert res[tired].status == "error" and "delivered" in (res[tired].error or "")
    # Then every key that got a result has its row: the dead letters' keys as errors of their kind
    rows = {r["key"]: r for r in read_table(ledger).to_pylist()}
    assert set(rows) == set(keys) and rows[good]["status"] == res[good].status
    for key in ("junk_s_0", tired):
        assert rows[key]["status"] == "error" and rows[key]["committed"] is True, rows[key]
        assert rows[key]["failure_kind"] == res[key].failure_kind and rows[key]["error"] == res[key].error
        assert_row_is_its_result(rows[key], res[key])
    # (a record that never decoded was never scored; an exhausted trajectory's attempt is its deliveries)
    assert rows["junk_s_0"]["attempt"] == 0 and rows["junk_s_0"]["scorer"] is None
    assert res[tired].attempt > 3 and rows[tired]["manager"] is None
    # And a dead letter's error result has a latency from its entry's put (none for one without a put time)
    latency = res[tired].latency_ms
    assert latency is not None and 0 < rows[tired]["latency_ms"] <= latency + 0.01
    assert res["junk_s_0"].latency_ms is None and rows["junk_s_0"]["latency_ms"] is None
    client.close()
