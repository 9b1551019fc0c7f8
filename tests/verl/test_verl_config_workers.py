"""``rewardq worker --config`` with verl's own generated trainer config, as real processes.

One worker per manager verl's reward loop registers (naive, dapo, gdpo, rate_limited, remote),
each started from a copy of ``verl/trainer/config/_generated_ppo_trainer.yaml`` with only
``reward.*`` edited as a verl user edits it; one from the untouched file with
``--manager rate_limited``; one from a file mixing top-level rewardq keys with a ``reward:``
block. Each scores a trajectory pushed by the verl adapter.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import verl
import yaml
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from tests.conftest import REDIS_URL, _delete_namespace
from tests.support.cli_procs import Procs, wait_for
from tests.support.sync_client import SyncClient
from tests.verl.conftest import Fleet, start_fleet
from tests.verl.data import output, row, verl_expected
from tests.verl.test_adapter import adapter

GENERATED = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"

REWARD_FN = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": 1.0, "experiment": (extra_info or {}).get("experiment_name"), "bonus": kwargs.get("bonus")}
"""


def verl_config(tmp_path: Path, manager: str | None, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    cfg = yaml.safe_load(GENERATED.read_text())
    if manager is not None:
        cfg["reward"]["reward_manager"]["name"] = manager
    if edit is not None:
        edit(cfg)
    path = tmp_path / f"verl-{manager}-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.fixture
def fleets(procs: Procs, sync_redis: SyncClient) -> Iterator[Callable[..., Fleet]]:
    started: list[Fleet] = []

    def start(*args: str, n: int = 1) -> Fleet:
        fleet = start_fleet(procs, sync_redis, *args, n=n, tag="cfg")
        started.append(fleet)
        return fleet

    yield start
    for fleet in started:
        for w in fleet.workers:
            w.terminate()
        _delete_namespace(REDIS_URL, fleet.namespace)


async def score(
    monkeypatch: pytest.MonkeyPatch, namespace: str, case: tuple[str, str, str] = ("openai/gsm8k", "42", "#### 42")
) -> tuple[list[AgentLoopOutput], dict[str, Any]]:
    w = adapter(monkeypatch, namespace)
    outputs = [output("turn one"), output(case[2])]
    kwargs = row(case[0], case[1])
    await w._compute_score(outputs, kwargs=kwargs)
    return outputs, kwargs


def test_the_generated_config_is_verls_own() -> None:
    cfg = yaml.safe_load(GENERATED.read_text())
    assert cfg["reward"]["num_workers"] == 8 and cfg["reward"]["reward_manager"]["name"] == "naive"
    assert cfg["reward"]["reward_model"]["rollout"]["name"] == "???"


async def test_a_worker_starts_from_verls_config_for_every_manager(
    tmp_path: Path, fleets: Callable[..., Fleet], monkeypatch: pytest.MonkeyPatch
) -> None:
    reward_fn = tmp_path / "reward.py"
    reward_fn.write_text(REWARD_FN)

    # a GDPO run: its own scoring function, with kwargs, reading trainer.experiment_name
    def gdpo(cfg: dict[str, Any]) -> None:
        cfg["reward"]["custom_reward_function"] = {"path": str(reward_fn), "name": "compute_score"}
        cfg["reward"]["custom_reward_function"]["reward_kwargs"] = {"bonus": 2}

    def dapo(cfg: dict[str, Any]) -> None:  # verl's DAPO recipe: the overlong buffer through reward_kwargs
        cfg["reward"]["reward_kwargs"] = {
            "overlong_buffer_cfg": {"enable": True, "len": 2, "penalty_factor": 1.0, "log": True},
            "max_resp_len": 64,
        }

    def limited(cfg: dict[str, Any]) -> None:
        cfg["reward"].update(max_rpm=600, max_concurrent=4)

    # verl's num_workers sizes the scorer pool; 2 of them on this 2-core machine
    def remote(cfg: dict[str, Any]) -> None:
        cfg["reward"]["num_workers"] = 2

    edits = {"naive": None, "dapo": dapo, "gdpo": gdpo, "rate_limited": limited, "remote": remote}
    started = {
        name: fleets("--config", str(verl_config(tmp_path, name, edit)), "--tokenizer", "builtin:demo")
        for name, edit in edits.items()
    }
    for name, fleet in started.items():
        outputs, kwargs = await score(monkeypatch, fleet.namespace)
        final = outputs[-1]
        assert final.extra_fields["reward_error"] is None, (name, final.extra_fields)
        if name == "gdpo":
            assert final.extra_fields["reward_extra_info"] == {"score": 1.0, "experiment": "gsm8k", "bonus": 2}
        elif name == "dapo":
            assert final.reward_score == 1.0 and final.extra_fields["reward_extra_info"]["overlong"] is False
        else:
            assert (final.reward_score, final.extra_fields["reward_extra_info"]) == verl_expected(outputs, kwargs)


async def test_the_untouched_config_with_manager_rate_limited_and_unused_keys_listed(
    tmp_path: Path, fleets: Callable[..., Fleet], monkeypatch: pytest.MonkeyPatch, sync_redis: SyncClient
) -> None:
    def extra(cfg: dict[str, Any]) -> None:
        cfg["reward"]["future_verl_knob"] = 1
        cfg["concurency"] = 8  # a typo of a rewardq key: listed with a suggestion, not fatal

    fleet = fleets(
        "--config", str(verl_config(tmp_path, None, extra)), "--manager", "rate_limited", "--tokenizer", "builtin:demo"
    )
    outputs, kwargs = await score(monkeypatch, fleet.namespace, ("math_dapo", "42", "Answer: 42"))
    assert (outputs[-1].reward_score, outputs[-1].extra_fields["reward_extra_info"]) == verl_expected(outputs, kwargs)
    results = list(sync_redis.scan_iter(match=f"{fleet.namespace}:*reward:*"))
    assert results and {sync_redis.hget(k, "manager") for k in results} == {b"rate_limited"}  # the flag won
    log = fleet.workers[0].stderr()
    lines = [line for line in log.splitlines() if "does not use" in line and "key(s)" in line]
    assert len(lines) == 1, log[-3000:]  # listed once
    assert "reward.future_verl_knob" in lines[0] and "concurency (did you mean concurrency?)" in lines[0]


async def test_top_level_rewardq_keys_beside_a_reward_block(
    tmp_path: Path, procs: Procs, sync_redis: SyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = f"t-verl-mixed-{uuid.uuid4().hex[:6]}"
    cfg = yaml.safe_load(GENERATED.read_text())
    cfg["reward"]["reward_manager"]["name"] = "dapo"
    cfg.update(redis_url=REDIS_URL, namespace=ns, tokenizer="builtin:demo", concurrency=3, cluster="false")
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    # no --redis-url / --namespace flags: both come from the file's top level
    worker = procs.start(["worker", "--config", str(path), "--name", "mixed", "--log-level", "INFO"], tag="mixed")
    try:
        wait_for(lambda: sync_redis.exists(f"{ns}:worker:mixed"), 120, "the mixed-config worker", procs=[worker])
        outputs, kwargs = await score(monkeypatch, ns, ("math_dapo", "42", "Answer: 41"))
        assert (outputs[-1].reward_score, outputs[-1].extra_fields["reward_extra_info"]) == verl_expected(
            outputs, kwargs
        )
        effective = next(line for line in worker.stderr().splitlines() if "effective config" in line)
        assert '"concurrency": 3' in effective and '"manager": "dapo"' in effective and '"cluster": false' in effective
    finally:
        assert worker.terminate() == 0, worker.stderr()[-2000:]
        _delete_namespace(REDIS_URL, ns)
