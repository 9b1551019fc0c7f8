"""``rewardq generate`` + ``rewardq produce``: replaying a JSONL file into a running worker.

Given a generated file with two bad lines, when it is replayed with ``--wait``, then the bad
lines are reported by number and field, every other trajectory is scored with its expected
reward, and the command exits 1 because lines failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli_procs import START_WAIT, Procs, wait_for, worker_argv
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.slow


def test_produce_reports_bad_lines_and_scores_the_rest(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, tmp_path: Path
) -> None:
    # Given a worker (starting in the background) and a 40-line file from `rewardq generate`
    worker = procs.start(
        worker_argv(redis_url, ns, "pw", "--log-level", "WARNING", manager="naive"),
        tag="worker",
    )
    path = tmp_path / "rollouts.jsonl"
    rc, gen = procs.run(["generate", str(path), "-n", "40", "--seed", "9"])
    assert rc == 0, gen.stderr()
    lines = path.read_text().splitlines()
    assert len(lines) == 40 and all(json.loads(line)["outputs"] for line in lines)

    # ... with line 5's first response_mask one entry short and line 12 not JSON at all
    bad = json.loads(lines[4])
    bad["outputs"][0]["response_mask"] = bad["outputs"][0]["response_mask"][:-1]
    lines[4] = json.dumps(bad)
    lines[11] = lines[11][: len(lines[11]) // 2]
    path.write_text("\n".join(lines) + "\n")
    wait_for(lambda: sync_redis.exists(f"{ns}:worker:pw"), START_WAIT, "the worker's heartbeat", procs=[worker])

    # When it is replayed and waited for
    rc, p = procs.run(
        ["produce", str(path), "--redis-url", redis_url, "--namespace", ns, "--wait", "--timeout", "60", "--json"],
        timeout=90,
    )
    err = p.stderr()

    # Then both bad lines are named with their field, and the command exits 1
    assert rc == 1, err
    assert "line 5: outputs[0].response_mask: has" in err and "but response_ids has" in err
    assert "line 12: <json>: not valid JSON" in err
    assert "pushed 38 trajectories" in err and "2 bad line(s): 5, 12" in err

    # And the 38 good lines were all scored, each exactly as expected
    summary = json.loads(p.stdout())
    assert (summary["trajectories"], summary["scored"], summary["missing"], summary["errors"]) == (38, 38, 0, 0)
    assert summary["expected"]["checked"] == 38 and summary["expected"]["mismatched"] == 0
    assert summary["bad_lines"] == 2

    # And `rewardq demo --workers 0` pushes to that running worker, then deletes only its own keys
    before = set(sync_redis.scan_iter(match=f"{ns}:*", count=1000))
    rc, demo = procs.run(
        ["demo", "--redis-url", redis_url, "--workers", "0", "-n", "20", "--seed", "1", "--json"],
        env={"REWARDQ_NAMESPACE": ns},
        timeout=90,
    )
    assert rc == 0, demo.stderr()
    result = json.loads(demo.stdout())
    assert (result["scored"], result["by_worker"], result["expected"]["mismatched"]) == (20, {"pw": 20}, 0)
    after = set(sync_redis.scan_iter(match=f"{ns}:*", count=1000))
    assert after - before == set() and len(before & after) == len(before) > 38
    assert worker.terminate() == 0


def test_produce_unreachable_redis_and_missing_file(procs: Procs, tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    rc, _ = procs.run(["generate", str(path), "-n", "1"])
    assert rc == 0
    rc, p = procs.run(["produce", str(path), "--redis-url", "redis://:hunter2@127.0.0.1:1/0", "--namespace", "x"])
    assert rc == 3 and "redis://:***@127.0.0.1:1/0" in p.stderr() and "hunter2" not in p.stderr()
    rc, p = procs.run(["produce", str(tmp_path / "nope.jsonl")])
    assert rc == 2 and "does not exist" in p.stderr() and "rewardq generate" in p.stderr()


def test_produce_wait_without_workers_times_out_and_exits_1(
    procs: Procs, redis_url: str, ns: str, tmp_path: Path
) -> None:
    path = tmp_path / "three.jsonl"
    assert procs.run(["generate", str(path), "-n", "3"])[0] == 0
    rc, p = procs.run(
        ["produce", str(path), "--redis-url", redis_url, "--namespace", ns, "--wait", "--timeout", "1", "--json"]
    )
    assert rc == 1, p.stderr()
    summary = json.loads(p.stdout())
    assert (summary["trajectories"], summary["missing"], summary["scored"]) == (3, 3, 0)
    assert len(summary["missing_keys"]) == summary["outputs"] and summary["bad_lines"] == 0
