"""The commands ``rewardq demo --namespace NS`` prints run as printed, on a single Redis and on a cluster.

Given a demo run that kept its namespace, when each printed line runs in ``bash`` exactly as printed,
then every "look at it" line exits 0 and shows the namespace (the listing names every key of the
namespace, on every node of a cluster), and the "delete it with" line leaves no key of it anywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.cli_procs import Procs
from tests.support.cluster import LocalCluster
from tests.support.sync_client import ClusterClient, SyncClient

pytestmark = pytest.mark.slow


def _bash(line: str) -> subprocess.CompletedProcess[str]:
    """One printed line, run as a user pastes it (the venv's ``rewardq`` on PATH)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120, env=env)


def _printed(stderr: str) -> tuple[list[str], str]:
    """The demo's "look at it with:" lines and its "delete it with:" line, as printed."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if "look at it with:" in line)
    end = lines.index("delete it with:")
    return [line.strip() for line in lines[start + 1 : end]], lines[end + 1].strip()


def _run_demo(procs: Procs, url: str, ns: str) -> str:
    rc, p = procs.run(
        ["demo", "--redis-url", url, "--namespace", ns, "--trajectories", "12", "--workers", "1", "--json"],
        timeout=180,
    )
    assert rc == 0, p.stderr() + p.stdout()
    return p.stderr()


def _check_look_lines(look: list[str], ns: str, every_key: set[str]) -> None:
    scan, xrevrange, hgetall, inspect, status = look
    listed = _bash(scan.removesuffix(" | head"))  # the whole listing, to compare with every key
    assert listed.returncode == 0, listed.stderr
    assert set(listed.stdout.split()) == every_key
    head = _bash(scan)
    assert head.returncode == 0 and 0 < len(head.stdout.split()) <= 10, head
    done = _bash(xrevrange)
    assert done.returncode == 0 and "tid" in done.stdout.split(), done
    reward = _bash(hgetall)
    assert reward.returncode == 0 and {"status", "reward_score"} <= set(reward.stdout.split()), reward
    assert f"{ns}:{{s0}}:reward:" in hgetall
    for line in (inspect, status):
        shown = _bash(line)
        assert shown.returncode == 0, (line, shown.stdout, shown.stderr)


def test_single_redis_hints_run_as_printed(procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient) -> None:
    look, delete = _printed(_run_demo(procs, redis_url, ns))
    assert look[0].startswith(f"redis-cli -u {redis_url} --scan --pattern '{ns}:*'")
    every_key = {k.decode() for k in sync_redis.scan_iter(match=f"{ns}:*", count=1000)}
    assert len(every_key) > 12
    _check_look_lines(look, ns, every_key)
    deleted = _bash(delete)
    assert deleted.returncode == 0, deleted.stderr
    assert not list(sync_redis.scan_iter(match=f"{ns}:*", count=1000))


@pytest.mark.cluster
def test_cluster_hints_run_as_printed(procs: Procs, redis_cluster: LocalCluster, rc: ClusterClient) -> None:
    ns = f"c-hints-{uuid.uuid4().hex[:8]}"
    try:
        stderr = _run_demo(procs, redis_cluster.url, ns)
        look, delete = _printed(stderr)
        assert "redis+cluster" not in " ".join(look[:3]) + delete  # redis-cli does not know that scheme
        # keys of the namespace on every primary, so a listing of one node would miss some
        for i in range(30):
            rc.set(f"{ns}:probe:{i}", "x")
        every_key = {k.decode() for k in rc.scan_iter(match=f"{ns}:*", count=1000)}
        owners = {rc.get_node_from_key(k).name for k in every_key}
        assert len(owners) == len(redis_cluster.ports), owners
        _check_look_lines(look, ns, every_key)
        deleted = _bash(delete)
        assert deleted.returncode == 0, deleted.stderr
        assert not list(rc.scan_iter(match=f"{ns}:*", count=1000))
    finally:
        left = list(rc.scan_iter(match=f"{ns}:*", count=1000))
        for k in left:
            rc.delete(k)
