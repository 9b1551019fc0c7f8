"""``reward.rewardq.fleet.workers`` in verl's config: verl's agent-loop worker (rewardq's subclass of
``AgentLoopWorker``, run as a Ray actor as verl runs it) starts the fleet on the trainer's Ray cluster
on first use, with no worker started by hand; a second process finds it alive and starts none; the
fleet ends with the process that owns it; without the key nothing starts.

Every reward is compared with verl's own ``default_compute_score`` on the decoded final response.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REDIS_URL, _delete_namespace
from tests.support.cli_procs import wait_for
from tests.support.sync_client import SyncClient
from tests.verl.data import output, row, verl_expected

#: A first use here starts Ray, a verl trainer or a Ray actor importing verl and torch: 100-230 s of
#: set-up beside the main suite's tail in CI, so the tests' 300 s default is too tight.
pytestmark = pytest.mark.timeout(900)

ray = pytest.importorskip("ray")

CASES = [
    ("openai/gsm8k", "42", "Six times seven. #### 42"),
    ("openai/gsm8k", "42", "I think #### 41"),
    ("lighteval/MATH", "\\frac{1}{2}", "so the answer is \\boxed{\\frac{1}{2}}"),
    ("math_dapo", "42", "Working...\nAnswer: 42"),
]


@pytest.fixture
def trainer_cluster(local_ray: None) -> None:
    """The trainer's Ray cluster: this test run's local Ray (tests/verl/conftest.py)."""
    return local_ray


@pytest.fixture
def namespace() -> Iterator[str]:
    ns = f"t-vfleet-{uuid.uuid4().hex[:8]}"
    yield ns
    _delete_namespace(REDIS_URL, ns)


def trainer_config(ns: str, fleet: dict[str, Any] | None) -> dict[str, Any]:
    """What a verl run's config holds for rewardq (the rest of verl's config changes nothing here)."""
    rewardq = {"redis_url": REDIS_URL, "namespace": ns, "tokenizer": "builtin:demo", "shutdown_grace": 5}
    if fleet is not None:
        rewardq["fleet"] = fleet
    return {
        "reward": {"reward_manager": {"name": "naive"}, "rewardq": rewardq},
        "trainer": {"use_v1": False},
        "algorithm": {"adv_estimator": "rewardq_grpo"},  # the legacy trainer's masking estimator
    }


@ray.remote
class AgentLoopProcess:
    """One of verl's agent-loop worker processes: an actor holding rewardq's ``AgentLoopWorker``."""

    def __init__(self, config: dict[str, Any]) -> None:
        from omegaconf import OmegaConf

        from rewardq.integrations.verl import RewardqAgentLoopWorker

        self.worker = object.__new__(RewardqAgentLoopWorker)  # verl's __init__ needs its servers
        self.worker.config = OmegaConf.create(config)

    async def score(self, cases: list[tuple[str, str, str]]) -> list[tuple[float, float]]:
        out = []
        for i, (data_source, truth, final) in enumerate(cases):
            outputs = [output("turn one " * (i + 1)), output(final, prompt="Question? " * 2)]
            kwargs = row(data_source, truth, index=i)
            await self.worker._compute_score(outputs, kwargs=kwargs)
            out.append((outputs[-1].reward_score, verl_expected(outputs, kwargs)[0]))
        return out

    def fleet_status(self) -> dict[str, Any] | None:
        from rewardq.integrations.verl.fleet import _starts

        started = [f.result() for f in _starts.values() if f.done() and f.exception() is None]
        return started[0].status() if started and started[0] is not None else None

    def pid(self) -> int:
        return os.getpid()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_fleet_key_starts_workers_on_first_use_and_they_stop_with_their_owner(
    trainer_cluster: None, namespace: str, sync_redis: SyncClient
) -> None:
    config = trainer_config(namespace, {"workers": 2, "num_cpus": 1, "timeout": 180})
    assert sync_redis.zcard(f"{namespace}:workers") == 0  # nobody started a worker by hand
    first = AgentLoopProcess.remote(config)  # type: ignore[attr-defined]  # ray.remote adds it
    scored = ray.get(first.score.remote(CASES), timeout=300)
    assert [got for got, _ in scored] == [want for _, want in scored]
    assert {want for _, want in scored} == {0.0, 1.0}  # the cases tell right from wrong

    st = ray.get(first.fleet_status.remote())
    assert st is not None and st["target"] == 2 and st["alive"] == 2, st
    assert all(w["name"].startswith(f"{namespace}-fleet-") for w in st["workers"])
    pids = [w[k] for w in st["workers"] for k in ("pid", "guardian_pid", "actor_pid")]

    # a second agent-loop process finds the workers alive: it scores on them and starts none
    second = AgentLoopProcess.remote(config)  # type: ignore[attr-defined]  # ray.remote adds it
    again = ray.get(second.score.remote(CASES[:2]), timeout=300)  # its first call waits for the actor's start
    assert [got for got, _ in again] == [want for _, want in again]
    assert ray.get(second.fleet_status.remote()) is None
    assert sync_redis.zcard(f"{namespace}:workers") == 2

    # the trainer ends: Ray ends its processes, the fleet's owner among them; the workers stop cleanly
    ray.kill(first)
    ray.kill(second)
    wait_for(lambda: not any(map(_alive, pids)), 120, "the fleet's processes to end")
    wait_for(lambda: sync_redis.zcard(f"{namespace}:workers") == 0, 60, "the workers to unregister")


def test_without_the_key_nothing_is_started(
    trainer_cluster: None, namespace: str, sync_redis: SyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = trainer_config(namespace, None)
    config["reward"]["rewardq"]["verl_timeout"] = 2
    loop = AgentLoopProcess.remote(config)  # type: ignore[attr-defined]  # ray.remote adds it
    t0 = time.monotonic()
    # the first call waits for the actor's start (a Ray worker importing verl and torch): over 60 s on a
    # loaded 2-core machine, beside the main suite's tail in CI
    ((got, _want),) = ray.get(loop.score.remote(CASES[:1]), timeout=300)
    # timed out: no worker, and none was started; the sample is left out of training (NaN: no reward)
    assert math.isnan(got) and time.monotonic() - t0 >= 2
    assert ray.get(loop.fleet_status.remote()) is None
    assert sync_redis.zcard(f"{namespace}:workers") == 0
    ray.kill(loop)


def test_a_bad_fleet_block_fails_the_first_trajectory_with_the_reason(trainer_cluster: None, namespace: str) -> None:
    config = trainer_config(namespace, {"workers": 1, "cpus": 2})
    loop = AgentLoopProcess.remote(config)  # type: ignore[attr-defined]  # ray.remote adds it
    with pytest.raises(ray.exceptions.RayTaskError, match=r"unknown key\(s\) \['cpus'\]"):
        # the first call waits for the actor's start (a Ray worker importing verl and torch): over 60 s
        # on a loaded 2-core machine, beside the main suite's tail in CI
        ray.get(loop.score.remote(CASES[:1]), timeout=300)
    ray.kill(loop)


def test_through_verls_reward_loop_the_hook_starts_the_fleet_and_it_ends_with_the_reward_loop(
    trainer_cluster: None, namespace: str, sync_redis: SyncClient, tmp_path: Path
) -> None:
    """verl's own RewardLoopManager loads RewardqRewardManager; verl's own AgentLoopWorker._compute_score
    sends it trajectories; the hook starts the fleet from inside verl's reward-loop actor."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop import RewardLoopManager

    from tests.verl.harness import bare_agent_loop_worker, demo_hf_folder, end_reward_loop, hook_config

    cfg = hook_config(
        demo_hf_folder(tmp_path / "policy"),
        namespace,
        shutdown_grace=5,
        fleet={"workers": 2, "num_cpus": 1, "timeout": 240},
    )
    assert sync_redis.zcard(f"{namespace}:workers") == 0
    manager = RewardLoopManager(cfg)  # verl's: reward.num_workers RewardLoopWorker actors
    w = bare_agent_loop_worker(AgentLoopWorker, manager.reward_loop_worker_handles)

    async def score_all() -> list[tuple[float, float]]:
        out = []
        for i, (data_source, truth, final) in enumerate(CASES):
            outputs = [output("turn one " * (i + 1)), output(final, prompt="Question? " * 2)]
            kwargs = row(data_source, truth, index=i)
            await AgentLoopWorker._compute_score(w, outputs, kwargs=kwargs)  # verl's own method
            out.append((outputs[-1].reward_score, verl_expected(outputs, kwargs)[0]))
        return out

    import asyncio

    scored = asyncio.run(score_all())
    assert [got for got, _ in scored] == [want for _, want in scored]
    beats = [
        sync_redis.hgetall(f"{namespace}:worker:{n.decode()}") for n in sync_redis.zrange(f"{namespace}:workers", 0, -1)
    ]
    assert len(beats) == 2 and all(b[b"host"] for b in beats)
    pids = [int(b[b"pid"]) for b in beats]
    assert all(map(_alive, pids))
    end_reward_loop(manager)  # the trainer ends: its reward loop goes with it
    wait_for(lambda: not any(map(_alive, pids)), 60, "the fleet's workers to end")
    wait_for(lambda: sync_redis.zcard(f"{namespace}:workers") == 0, 60, "the workers to unregister")
