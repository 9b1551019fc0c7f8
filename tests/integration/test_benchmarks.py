"""Smoke test of ``python -m benchmarks``: it runs, prints every row, and the numbers are finite.

Behaviour only: speeds are never asserted (the machine may be busy). Uses the real Redis
of the rest of the suite, except the run whose memory rows are checked (a Redis of its own); the
benchmark deletes its own keys and stops its own processes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_procs import REPO
from tests.support.redis_server import RedisServer
from tests.support.sync_client import SyncClient


def run_bench(
    redis_url: str, out: Path, *args: str, timeout: float
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``python -m benchmarks --quick ARGS`` on the suite's Redis; the process and its JSON.

    A run still going after ``timeout`` gets SIGTERM, on which it stops its workers and deletes its
    keys (a SIGKILL would leave both behind), and then fails the test."""
    cmd = [sys.executable, "-m", "benchmarks", "--quick", *args, "--url", redis_url, "--json", str(out)]
    with subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
    ) as p:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
            stdout, stderr = p.communicate(timeout=60)
            raise AssertionError(f"the benchmark ran over {timeout}s and was stopped:\n{stderr[-3000:]}") from None
    proc = subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.mark.timeout(150)
def test_quick_raw_and_rewardq_prints_every_row_with_finite_numbers(tmp_path: Path) -> None:
    # Given a tiny quick run of the raw baseline and rewardq (every phase), on a Redis of its own: the
    # memory rows read the server's used_memory, which other tests on the shared one move meanwhile
    with RedisServer(extra=["--maxmemory", "1gb"]) as server:
        _quick_run_prints_every_row(server.url, tmp_path, server.client())


def _quick_run_prints_every_row(redis_url: str, tmp_path: Path, sync_redis: SyncClient) -> None:
    # When it runs
    proc, data = run_bench(
        redis_url,
        tmp_path / "bench.json",
        "--only",
        "raw,rewardq",
        "--trajectories",
        "200",
        "--latency-samples",
        "20",
        "--backlogs",
        "100,1000",
        timeout=110,
    )
    # Then it succeeds and prints the table with a row per system and phase, and the targets
    text = proc.stdout
    for needle in (
        "raw",
        "raw-noscore",
        "rewardq",
        "throughput",
        "latency",
        "memory",
        "targets",
        "throughput vs raw baseline",
        "p99 latency",
        "worker peak RSS",
    ):
        assert needle in text, f"{needle!r} missing from:\n{text}"
    # And every measured number is finite, every reward checked out
    rows = {(r["system"], r["phase"], r["workers"], r["backlog"]): r for r in data["rows"]}
    assert {(k[0], k[1], k[2]) for k in rows} == {
        ("raw", "throughput", 1),
        ("raw", "latency", 1),
        ("raw-noscore", "throughput", 1),
        ("rewardq", "throughput", 1),
        ("rewardq", "latency", 1),
        ("rewardq", "throughput", 2),
        ("rewardq", "memory", 1),
        ("rewardq", "memory+images", 1),
    }
    for key, r in rows.items():
        assert r["status"] == "ok", (key, r["status"])
        wanted = {
            "throughput": ("outputs_per_s", "traj_per_s", "seconds", "rss_mb", "cpu_ms"),
            "latency": ("p50_ms", "p99_ms", "max_ms"),
            "memory": ("rss_mb",),
            "memory+images": ("rss_mb",),
        }[r["phase"]]
        for name in wanted:
            # cpu_ms is CPU time per trajectory, rounded: a 200-trajectory raw run may round to 0
            assert isinstance(r[name], (int, float)) and math.isfinite(r[name]), (key, name, r)
            assert r[name] >= 0 if name == "cpu_ms" else r[name] > 0, (key, name, r)
        if not r["phase"].startswith("memory"):
            assert r["check"] == "ok", (key, r["check"])
    assert sorted(r["backlog"] for r in data["rows"] if r["phase"] == "memory") == [100, 1000]
    # And the row with images costs Redis their bytes on top of the records, per waiting trajectory
    images, plain = rows[("rewardq", "memory+images", 1, 100)], rows[("rewardq", "memory", 1, 100)]
    added_kb = images["extra"]["redis_kb_per_trajectory"] - plain["extra"]["redis_kb_per_trajectory"]
    assert 200 < added_kb < 300, (added_kb, images["note"])  # 228 KB of images per trajectory
    # And latency is timed from the final output's put by default (outputs 0..n-2 went before)
    assert data["settings"]["latency_mode"] == "final"
    assert "put_output(final)" in rows[("rewardq", "latency", 1, None)]["note"]
    # And each verdict follows from the numbers of this run
    verdicts = {t["name"]: t["verdict"] for t in data["targets"]}
    ratio = (
        rows[("rewardq", "throughput", 1, None)]["outputs_per_s"]
        / rows[("raw", "throughput", 1, None)]["outputs_per_s"]
    )
    assert verdicts["throughput vs raw baseline (1 worker)"] == ("PASS" if ratio >= 0.7 else "MISS"), (ratio, verdicts)
    one_worker, two_workers = rows[("rewardq", "throughput", 1, None)], rows[("rewardq", "throughput", 2, None)]
    two = two_workers["traj_per_s"] / one_worker["traj_per_s"]
    assert verdicts["two workers vs one"] == ("PASS" if two >= 1.8 else "MISS"), (two, verdicts)
    p99 = rows[("rewardq", "latency", 1, None)]["p99_ms"]
    assert verdicts["p99 latency, final put -> reward readable"] == ("PASS" if p99 <= 3.0 else "MISS"), (p99, verdicts)
    # And it left none of its keys behind
    run_id = data["settings"]["run_id"]
    assert not list(sync_redis.scan_iter(match=f"rqbench-{run_id}-*", count=1000))


@pytest.mark.timeout(90)
def test_whole_trajectory_latency_mode_times_one_put_of_every_output(redis_url: str, tmp_path: Path) -> None:
    # Given a latency-only run in "whole" mode (one put_trajectory inside the timed interval)
    _, data = run_bench(
        redis_url,
        tmp_path / "bench.json",
        "--only",
        "raw,rewardq",
        "--phases",
        "latency",
        "--latency-samples",
        "10",
        "--latency-mode",
        "whole",
        timeout=80,
    )
    # Then both systems report finite latencies of checked rewards, labelled with the mode
    assert data["settings"]["latency_mode"] == "whole"
    rows = {r["system"]: r for r in data["rows"]}
    assert set(rows) == {"raw", "rewardq"}
    for r in rows.values():
        assert r["status"] == "ok" and r["check"] == "ok", r
        assert math.isfinite(r["p99_ms"]) and r["p99_ms"] >= r["p50_ms"] > 0, r
    assert "put_trajectory" in rows["rewardq"]["note"]


@pytest.mark.timeout(120)
def test_trivial_scorer_run_measures_every_system_around_a_decode_free_score(redis_url: str, tmp_path: Path) -> None:
    # Given a small run with the trivial scorer (the reference conditions)
    _, data = run_bench(
        redis_url,
        tmp_path / "bench.json",
        "--scorer",
        "trivial",
        "--only",
        "raw,rewardq",
        "--phases",
        "throughput,latency",
        "--one-worker",
        "--trajectories",
        "150",
        "--latency-samples",
        "10",
        timeout=110,
    )
    assert data["settings"]["scorer"] == "trivial"
    # Then raw is the baseline itself (no separate no-score row), rewardq ran its trivial
    # manager with one worker, and every sampled reward is the trivial scorer's (parity of
    # the final response length, so a misrouted result would show)
    rows = {(r["system"], r["phase"], r["workers"]): r for r in data["rows"]}
    assert set(rows) == {
        ("raw", "throughput", 1),
        ("raw", "latency", 1),
        ("rewardq", "throughput", 1),
        ("rewardq", "latency", 1),
    }
    assert "trivial manager" in rows[("rewardq", "throughput", 1)]["note"]
    for key, r in rows.items():
        assert r["status"] == "ok" and r["check"] == "ok", (key, r)


def test_trivial_expected_reward_is_the_parity_of_the_final_response() -> None:
    from benchmarks.workload import Workload, trivial_score

    wl = Workload(0)
    got = {wl[i].expected_for("trivial") for i in range(40)}
    assert got == {0.0, 1.0}  # both values occur, so a constant answer fails the checks
    for i in range(40):
        t = wl[i]
        assert t.expected_for("trivial") == trivial_score(len(t.responses[-1]))
        assert t.expected_for("gsm8k") == t.expected
