"""`python -m benchmarks --only ledger`: behaviour only (speeds are never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_benchmarks import run_bench
from tests.support.sync_client import SyncClient


@pytest.mark.timeout(240)
def test_the_ledger_benchmark_measures_cpu_and_latency_with_and_without_it(
    redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    proc, data = run_bench(
        redis_url,
        tmp_path / "bench.json",
        "--only",
        "ledger",
        "--trajectories",
        "150",
        "--latency-samples",
        "20",
        timeout=230,
    )
    rows = {(r["system"], r["phase"], r["note"].split(";")[0]): r for r in data["rows"]}
    off, on = rows[("rewardq", "ledger A/B", "round 1")], rows[("rewardq+ledger", "ledger A/B", "round 1")]
    assert off["status"] == on["status"] == "ok" and off["trajectories"] == on["trajectories"] == 150
    assert off["cpu_ms"] > 0 and on["cpu_ms"] > 0 and "ledger rows" in on["note"]
    assert {("rewardq", "round 1"), ("rewardq+ledger", "round 1"), ("rewardq", "round 2")} == {
        (s, n) for s, p, n in rows if p == "ledger A/B latency"
    }
    assert rows[("provenance", "micro", rows_note(data))]["status"] == "ok"
    [flusher] = [r for r in data["rows"] if r["phase"] == "ledger flusher"]
    assert flusher["status"] == "ok" and flusher["extra"]["rows"] > 0 and flusher["rss_mb"] > 0
    targets = {t["name"]: t for t in data["targets"]}
    assert targets["ledger: CPU per trajectory (GSM8K), the worker process"]["verdict"] in ("PASS", "MISS")
    tree = "ledger: CPU per trajectory (GSM8K), the worker's process tree (worker + flusher + scorer processes)"
    assert targets[tree]["verdict"] in ("PASS", "MISS")
    assert on["extra"]["flusher_cpu_ms"] > 0 and off["extra"]["flusher_cpu_ms"] == 0  # Parquet in its own process
    for row in (off, on):  # the tree's CPU is its parts': the worker, its flusher, its other children
        parts = ("worker_cpu_ms", "flusher_cpu_ms", "children_cpu_ms")
        assert row["cpu_ms"] == pytest.approx(sum(row["extra"][k] for k in parts))
    assert off["extra"]["tree_processes"] == 1 and on["extra"]["tree_processes"] == 2  # GSM8K scores inline
    assert targets["ledger: latency p99 within the plain runs' noise"]["verdict"] in ("PASS", "MISS")
    assert "ledger: CPU per trajectory" in proc.stdout
    assert not sync_redis.keys("rqbench-*ledger*")  # every key the run wrote is gone


def rows_note(data: dict[str, object]) -> str:
    rows = data["rows"]
    assert isinstance(rows, list)
    return str(next(r["note"].split(";")[0] for r in rows if r["system"] == "provenance"))
