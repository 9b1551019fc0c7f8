"""rewardq workers as Ray actors (rewardq.integrations.ray) on a local Ray cluster and the real Redis.

The cluster is this machine only (``address="local"``: never another cluster), with 4 logical CPUs
and a custom ``rewardq_cpu`` resource, so placement by ``num_cpus`` and ``resources`` is real.
Workers run ``tests.support.managers:EchoManager`` (one reward per key, from its own ids), so every
key's value is checked, and the verdict of ``tests.support.exactly_once`` proves nothing was lost
or written twice after a SIGKILL.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.ray_start import init_local_ray
from rewardq.errors import ConfigError
from rewardq.producers.client import RewardClient
from rewardq.queue.keys import Keyspace
from tests.support.cli_procs import REPO, wait_for
from tests.support.exactly_once import make_trajectories, push, settle
from tests.support.sync_client import SyncClient

ray = pytest.importorskip("ray", reason="rewardq[ray] is part of the test extra; install it")

from rewardq.integrations.ray import Autoscale, FleetError, start_fleet  # noqa: E402

pytestmark = pytest.mark.slow

ECHO = "tests.support.managers:EchoManager"
FAST: dict[str, Any] = {
    "manager": ECHO,
    "tokenizer": "builtin:demo",
    "heartbeat_interval": 0.5,
    "lease_seconds": 3.0,
    "maintenance_interval": 0.5,
    "claim_idle": 3.0,
    "shutdown_grace": 5.0,
    "block_ms": 200,
    "log_level": "WARNING",
}
ENV = {"PYTHONPATH": str(REPO)}  # the worker processes import tests.support.managers


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    tmp = init_local_ray(  # under /tmp: Ray's socket paths have a limit
        "rq-ray-",
        include_dashboard=False,
        num_cpus=4,
        resources={"rewardq_cpu": 4},
        log_to_driver=False,
    )
    yield
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def _groups_alive(pgids: set[int]) -> list[int]:
    """Pids of live processes in any of these process groups (a worker and what it started)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) in pgids:
            out.append(int(entry.name))
    return out


def _exists(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pids(st: dict[str, Any]) -> tuple[set[int], set[int]]:
    """The worker processes, and the actors with the guardians between them and their workers."""
    running = [w for w in st["workers"] if w.get("pid")]
    return {w["pid"] for w in running}, {w["actor_pid"] for w in running} | {w["guardian_pid"] for w in running}


def test_two_workers_score_500_trajectories_and_stop_leaves_nothing(
    ray_cluster: None, ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    before = ray.available_resources().get("rewardq_cpu", 0)
    fleet = start_fleet(
        workers=2, config=FAST, namespace=ns, redis_url=redis_url, resources={"rewardq_cpu": 1}, env=ENV, timeout=120
    )
    try:
        st = fleet.status()
        assert st["target"] == 2 and st["alive"] == 2, st
        assert ray.available_resources().get("rewardq_cpu", 0) == before - 2  # one rewardq_cpu per worker
        names = {w["name"] for w in st["workers"]}
        assert all(n.startswith(f"{ns}-fleet-") for n in names) and len(names) == 2

        client = RewardClient.from_url(redis_url, namespace=ns)
        trajectories = make_trajectories(500, seed=3)
        keys = push(client, trajectories)
        client.wait_rewards(keys, timeout=180)
        expected = {k: v for t in trajectories for k, v in t.expected.items()}
        verdict = settle(sync_redis, Keyspace(ns), expected, timeout=30)
        assert verdict.clean and not any(verdict.leftovers.values()), verdict.explain()
        scored_by = {
            (sync_redis.hget(Keyspace(ns).traj_key(f"{t.uid}_{t.session_id}"), "worker") or b"").decode()
            for t in trajectories
        }
        assert scored_by == names  # both workers took a share
        client.close()

        st = fleet.status()
        assert st["backlog"]["entries"] == 0 and st["backlog_seconds"] == 0.0
        workers, actors = _pids(st)
    finally:
        fleet.stop()
    assert fleet.status()["target"] == 0
    wait_for(lambda: not _groups_alive(workers) and not any(map(_exists, actors)), 30, "every fleet process to end")
    wait_for(lambda: ray.available_resources().get("rewardq_cpu", 0) == before, 30, "Ray to free the resources")
    assert sync_redis.zcard(Keyspace(ns).workers) == 0  # every worker unregistered (a clean stop)


def test_sigkill_of_a_worker_process_is_restarted_by_ray_and_nothing_is_lost(
    ray_cluster: None, ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    config = {**FAST, "manager_options": {"sleep": 0.05}, "concurrency": 8}
    fleet = start_fleet(workers=2, config=config, namespace=ns, redis_url=redis_url, env=ENV, timeout=120)
    try:
        first = fleet.status()["workers"]
        client = RewardClient.from_url(redis_url, namespace=ns)
        trajectories = make_trajectories(300, seed=4)
        keys = push(client, trajectories)
        victim = first[0]
        wait_for(lambda: (fleet.status()["workers"][0]["in_flight"] or 0) > 0, 60, "the victim to hold trajectories")
        os.kill(victim["pid"], signal.SIGKILL)

        def restarted() -> bool:
            w = fleet.status()["workers"][0]
            result: bool = w["name"] != victim["name"] and w["alive"] and w["restarts"] >= 1
            return result

        wait_for(restarted, 120, "Ray to restart the killed worker")
        again = fleet.status()["workers"][0]
        assert again["pid"] != victim["pid"] and again["actor_pid"] != victim["actor_pid"]
        assert not _exists(victim["pid"]) and not _groups_alive({victim["pid"]})

        client.wait_rewards(keys, timeout=180)
        expected = {k: v for t in trajectories for k, v in t.expected.items()}
        verdict = settle(sync_redis, Keyspace(ns), expected, timeout=30)
        assert verdict.clean and not any(verdict.leftovers.values()), verdict.explain()
        client.close()
        workers, actors = _pids(fleet.status())
    finally:
        fleet.stop()
    wait_for(lambda: not _groups_alive(workers) and not any(map(_exists, actors)), 30, "every fleet process to end")


def test_sigkill_of_an_actor_stops_its_worker_gracefully_and_ray_starts_a_new_pair(
    ray_cluster: None, ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    fleet = start_fleet(workers=1, config=FAST, namespace=ns, redis_url=redis_url, env=ENV, timeout=120)
    try:
        (old,) = fleet.status()["workers"]
        os.kill(old["actor_pid"], signal.SIGKILL)
        # the kernel's parent-death signal is SIGTERM: the orphaned worker stops cleanly and unregisters
        wait_for(lambda: not _groups_alive({old["pid"]}), 30, "the orphaned worker to stop")
        wait_for(lambda: old["name"].encode() not in sync_redis.zrange(Keyspace(ns).workers, 0, -1), 10, "unregister")
        wait_for(lambda: fleet.status()["alive"] == 1, 120, "a new worker")
        (new,) = fleet.status()["workers"]
        assert new["name"] != old["name"] and new["reconstructed"] is True
        workers, actors = _pids(fleet.status())
    finally:
        fleet.stop()
    wait_for(lambda: not _groups_alive(workers) and not any(map(_exists, actors)), 30, "every fleet process to end")


def test_scale_down_to_one_and_stop_leave_no_process(
    ray_cluster: None, ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    fleet = start_fleet(workers=3, config=FAST, namespace=ns, redis_url=redis_url, env=ENV, timeout=120)
    try:
        st = fleet.status()
        assert st["alive"] == 3
        gone = st["workers"][1:]
        fleet.scale(1)
        st = fleet.status()
        assert st["target"] == 1 and [w["index"] for w in st["workers"]] == [0]
        for w in gone:  # the workers stopped gracefully before scale returned
            assert not _groups_alive({w["pid"]}), w
            assert w["name"].encode() not in sync_redis.zrange(Keyspace(ns).workers, 0, -1)
        # their actors end with ray.kill, which Ray carries out asynchronously
        wait_for(lambda: not any(_exists(w["actor_pid"]) for w in gone), 30, "the removed actors' processes to end")
        fleet.scale(2)  # and back up: a new worker takes index 1
        st = fleet.status()
        assert st["alive"] == 2 and st["workers"][1]["name"] not in {w["name"] for w in gone}
        workers, actors = _pids(st)
    finally:
        fleet.stop()
    fleet.stop()  # twice is harmless
    wait_for(lambda: not _groups_alive(workers) and not any(map(_exists, actors)), 30, "every fleet process to end")
    with pytest.raises(FleetError, match="stopped"):
        fleet.scale(1)


def test_a_worker_config_error_fails_start_fleet_with_the_log_and_is_not_restarted(
    ray_cluster: None, ns: str, redis_url: str
) -> None:
    with pytest.raises(FleetError) as info:
        start_fleet(
            workers=1, config={**FAST, "manager": "no_such_manager"}, namespace=ns, redis_url=redis_url, timeout=120
        )
    assert "configuration error" in str(info.value) and "no_such_manager" in str(info.value)


def test_a_bad_setting_is_refused_on_the_driver_before_any_actor_starts(
    ray_cluster: None, ns: str, redis_url: str
) -> None:
    with pytest.raises(ConfigError, match="concurrency"):
        start_fleet(workers=2, config={**FAST, "concurrency": -1}, namespace=ns, redis_url=redis_url)
    with pytest.raises(ConfigError, match="autoscale"):
        start_fleet(workers=1, config=FAST, namespace=ns, autoscale={"min": 3, "max": 2})


def test_resources_the_cluster_lacks_end_in_a_clear_error(ray_cluster: None, ns: str, redis_url: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(FleetError, match="resources"):
        start_fleet(workers=1, config=FAST, namespace=ns, redis_url=redis_url, resources={"no_such_node": 1}, timeout=5)
    assert time.monotonic() - t0 < 60


def test_autoscaling_adds_a_worker_for_a_backlog_and_removes_it_once_drained(
    ray_cluster: None, ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    config = {**FAST, "manager_options": {"sleep": 0.1}, "concurrency": 4}
    policy = Autoscale(min_workers=1, max_workers=2, target_drain_s=2.0, interval_s=0.5, scale_down_after_s=2.0)
    fleet = start_fleet(workers=1, config=config, namespace=ns, redis_url=redis_url, env=ENV, autoscale=policy)
    try:
        client = RewardClient.from_url(redis_url, namespace=ns)
        trajectories = make_trajectories(600, seed=5)
        keys = push(client, trajectories)
        wait_for(lambda: fleet.status()["target"] == 2, 90, "the autoscaler to add a worker")
        st = fleet.status()
        assert st["autoscale"]["last"]["wanted"] == 2 and st["autoscale"]["max_workers"] == 2
        client.wait_rewards(keys, timeout=180)
        wait_for(lambda: fleet.status()["target"] == 1, 60, "the autoscaler to remove the worker again")
        expected = {k: v for t in trajectories for k, v in t.expected.items()}
        verdict = settle(sync_redis, Keyspace(ns), expected, timeout=30)
        assert verdict.clean, verdict.explain()
        client.close()
    finally:
        fleet.stop()
