"""``rewardq demo`` end to end: embedded Redis stand-in, and the real Redis.

Given nothing running but the demo, when it runs, then it exits 0, prints its summary, every
reward equals the generator's expected value, and it leaves no keys and no processes behind.
"""

from __future__ import annotations

import json
from pathlib import Path

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
    assert out.splitlines()[0] == "rewardq demo: rewards by data source"  # one line, no trailing spaces


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
    assert f"kept namespace {ns}" in err and f"redis-cli -u {redis_url} --scan --pattern '{ns}:*'" in err
    assert f"rewardq status --redis-url {redis_url} --namespace {ns}" in err and "DEL" in err
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


def _without_demo_extra(tmp: Path) -> dict[str, str]:
    """An environment in which ``fakeredis`` and ``lupa`` cannot be imported (a ``[worker]`` install)."""
    site = tmp / "no-demo-extra"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoDemoExtra:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in ('fakeredis', 'lupa'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NoDemoExtra())\n"
    )
    return {"PYTHONPATH": str(site)}


def test_demo_without_the_demo_extra_uses_the_redis_it_finds(
    procs: Procs, redis_url: str, sync_redis: SyncClient, tmp_path: Path
) -> None:
    env = {**_without_demo_extra(tmp_path), "REWARDQ_REDIS_URL": redis_url}
    rc, p = procs.run(["demo", "--trajectories", "20", "--workers", "1", "--json"], env=env, timeout=180)
    assert rc == 0, p.stderr() + p.stdout()
    summary = json.loads(p.stdout())
    assert summary["mode"].startswith("Redis at redis://127.0.0.1:6379") and "rewardq[demo]" in summary["mode"]
    assert (summary["scored"], summary["errors"], summary["missing"]) == (20, 0, 0)
    assert not list(sync_redis.scan_iter(match=f"{summary['namespace']}:*", count=1000))  # its keys are gone


def test_demo_without_the_demo_extra_or_a_redis_says_what_to_do(procs: Procs, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**_without_demo_extra(tmp_path), "REWARDQ_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    rc, p = procs.run(["demo", "--trajectories", "5"], env=env, timeout=120)
    err = p.stderr()
    assert rc == 2, err
    assert "pip install 'rewardq[demo]'" in err and "--redis-url" in err and f"127.0.0.1:{port}" in err, err
    assert "this is a bug" not in err and "Traceback" not in err, err
    # proof the stand-in really is missing there: the same environment cannot import it
    rc, p = procs.run(["demo", "--trajectories", "5", "--redis-url", f"redis://127.0.0.1:{port}/0"], env=env)
    assert rc == 3 and "cannot connect" in p.stderr(), p.stderr()
