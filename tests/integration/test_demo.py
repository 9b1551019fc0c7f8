"""``rewardq demo`` end to end: embedded Redis stand-in, and the real Redis.

Given nothing running but the demo, when it runs, then it exits 0, prints its summary, every
reward equals the generator's expected value, and it leaves no keys and no processes behind.
"""

from __future__ import annotations

import json

import pytest

from tests.support.cli_procs import Procs
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.slow


def test_demo_embedded_prints_summary_and_exits_0(procs: Procs) -> None:
    rc, p = procs.run(
        ["demo", "--trajectories", "120", "--workers", "2", "--seed", "3"], env={"COLUMNS": "200"}, timeout=120
    )
    out, err = p.stdout(), p.stderr()
    assert rc == 0, err + out
    # the mode is stated, and the summary table has every part
    assert "embedded Redis stand-in (fakeredis" in out and "2 worker processes" in out
    for needle in (
        "openai/gsm8k",
        "lighteval/MATH",
        "mean reward",
        "accuracy",
        "trajectories/s",
        "outputs/s",
        "p50",
        "p99",
        "0 error results, 0 without a result",
        "120/120 rewards equal the expected value",
    ):
        assert needle in out, (needle, out)
    assert "pushing trajectories" in err and "waiting for rewards" in err


def test_demo_named_namespace_keeps_its_keys_and_says_how_to_look(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    rc, p = procs.run(
        ["demo", "--redis-url", redis_url, "--namespace", ns, "--trajectories", "150", "--workers", "1", "--json"],
        timeout=120,
    )
    assert rc == 0, p.stderr() + p.stdout()
    summary = json.loads(p.stdout())
    assert summary["mode"].startswith("Redis at redis://127.0.0.1:6379")
    assert (summary["trajectories"], summary["scored"], summary["errors"], summary["missing"]) == (150, 150, 0, 0)
    assert summary["expected"] == {"checked": 150, "mismatched": 0, "samples": []}
    assert summary["outputs"] > 150 and summary["trajectories_per_s"] > 0
    assert 0 < summary["latency_ms"]["p50"] <= summary["latency_ms"]["p99"]
    assert set(summary["by_data_source"]) == {"openai/gsm8k", "lighteval/MATH"}
    for row in summary["by_data_source"].values():
        assert 0 < row["accuracy"] < 1 and row["mean_reward"] == row["accuracy"]
    assert sum(summary["by_worker"].values()) == 150
    assert summary["worker_exit_codes"] == [0] and summary["workers"] == 1
    # the namespace the user named stays, with a result for every key, and the demo says how to look
    assert summary["namespace"] == ns and summary["kept_namespace"] is True
    rewards = list(sync_redis.scan_iter(match=f"{ns}:*:reward:*", count=1000))
    assert len(rewards) == summary["outputs"]
    assert sync_redis.xlen(f"{ns}:{{s0}}:done") == 150
    err = p.stderr()
    assert f"kept namespace {ns}" in err and f"redis-cli -u redis://127.0.0.1:6379/0 --scan --pattern '{ns}:*'" in err
    assert f"rewardq status --redis-url redis://127.0.0.1:6379/0 --namespace {ns}" in err and "DEL" in err
    hgetall = next(line for line in err.splitlines() if "HGETALL" in line).strip().split()
    assert hgetall[:3] == ["redis-cli", "-u", redis_url] and sync_redis.exists(hgetall[-1].strip("'"))


def test_demo_generated_namespace_is_deleted(procs: Procs, redis_url: str, sync_redis: SyncClient) -> None:
    rc, p = procs.run(
        ["demo", "--redis-url", redis_url, "--trajectories", "20", "--workers", "1", "--json"], timeout=120
    )
    assert rc == 0, p.stderr() + p.stdout()
    summary = json.loads(p.stdout())
    assert summary["namespace"].startswith("demo-") and summary["kept_namespace"] is False
    assert "kept namespace" not in p.stderr()
    assert not list(sync_redis.scan_iter(match=f"{summary['namespace']}:*", count=1000))
