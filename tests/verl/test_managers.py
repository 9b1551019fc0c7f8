"""The managers verl loads from ``agent_loop_manager_class``, on the trainers that read it.

verl's V1 trainer (its default) imports the ``transfer_queue`` package, which verl 0.9.1 does not
install by itself: the registry's ``transferqueue==0.1.11`` is installed beside it (.ci/run), and
verl's real ``AgentLoopWorkerTQ._agent_loop_postprocess`` stores into it here, on a local Ray;
the stored rewards are read back with the real client. The one-step-off trainer builds its manager
with verl's own ``OneStepOffRayTrainer._init_async_rollout_manager``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import verl
from omegaconf import OmegaConf

from rewardq.integrations import verl as adapter
from tests.conftest import REDIS_URL
from tests.support.managers import expected_reward
from tests.verl.conftest import Fleet
from tests.verl.data import output, row, verl_expected

MANAGER = "rewardq.integrations.verl.RewardqAgentLoopManager"


def config(use_v1: bool) -> Any:
    """The parts of a trainer config the managers read; verl's V1 task runner turns TransferQueue on."""
    return OmegaConf.create(
        {
            "trainer": {"use_v1": use_v1},
            "transfer_queue": {"enable": use_v1},
            # what masks a failed sample on each (verl_on_error=mask, docs/verl-integration.md section 4a)
            "algorithm": {"adv_estimator": "grpo" if use_v1 else "rewardq_grpo"},
            "actor_rollout_ref": {"rollout": {"agent": {"num_workers": 1}}, "model": {"path": "/nowhere"}},
        }
    )


async def no_workers(self: Any) -> None:
    self.agent_loop_workers = []


@pytest.fixture
def no_actors(monkeypatch: pytest.MonkeyPatch, real_tq: ModuleType) -> None:
    """Managers built without starting agent-loop actors (verl's _init_agent_loop_workers needs LLM servers)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    monkeypatch.setattr(AgentLoopManager, "_init_agent_loop_workers", no_workers)


def worker_class_of(manager: Any) -> type:
    result: type = manager.agent_loop_workers_class.__ray_metadata__.modified_class
    return result


def test_one_override_works_on_both_of_verls_trainers(no_actors: None) -> None:
    # verl's legacy trainer: the plain manager and worker
    plain = adapter.RewardqAgentLoopManager.create(config=config(False), llm_client=None)
    assert type(plain) is adapter.RewardqAgentLoopManager
    assert issubclass(worker_class_of(plain), adapter.RewardqAgentLoopWorker)
    # verl's V1 trainer (its default): the same class name hands over to the TransferQueue variant
    v1 = adapter.RewardqAgentLoopManager.create(config=config(True), llm_client=None)
    assert type(v1) is adapter.RewardqAgentLoopManagerTQ
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

    assert isinstance(v1, AgentLoopManagerTQ)
    worker_cls = worker_class_of(v1)
    assert issubclass(worker_cls, adapter.RewardqAgentLoopWorkerTQ)
    assert issubclass(worker_cls, AgentLoopWorkerTQ.__ray_metadata__.modified_class)
    # importable by name, as verl's load_class_from_fqn and Ray find them
    from verl.utils.import_utils import load_class_from_fqn

    assert load_class_from_fqn("rewardq.integrations.verl.RewardqAgentLoopManagerTQ") is type(v1)


def tq_worker(monkeypatch: pytest.MonkeyPatch, namespace: str) -> Any:
    """A TransferQueue worker whose verl __init__ never ran, as far as _agent_loop_postprocess needs."""
    monkeypatch.setenv("REWARDQ_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("REWARDQ_NAMESPACE", namespace)
    w: Any = object.__new__(adapter.RewardqAgentLoopWorkerTQ)
    w.processor = None  # text-only model: verl's multimodal and position-id helpers take their plain path
    w.distillation_enabled = False
    return w


def stored(tq: ModuleType, keys: list[str]) -> list[tuple[float, dict[str, Any]]]:
    """Each key's reward and reward_extra_info as verl's V1 trainer reads them back from TransferQueue."""
    got = tq.kv_batch_get(keys=keys, partition_id="train")
    return [(float(got["rm_scores"][i].sum()), got["extra_fields"][i]["reward_extra_info"]) for i in range(len(keys))]


async def test_transferqueue_path_stores_verls_rewards(
    monkeypatch: pytest.MonkeyPatch, naive_fleet: Fleet, real_tq: ModuleType
) -> None:
    w = tq_worker(monkeypatch, naive_fleet.namespace)
    uid = f"tq-{uuid.uuid4().hex[:8]}"
    outputs = [output("first turn"), output("Answer: 42", tool="<tool>ok</tool>")]
    kwargs: dict[str, Any] = {**row("math_dapo", "42", uid=uid), "session_id": 3, "global_steps": 7}
    score, extra = verl_expected(outputs, kwargs)
    await w._agent_loop_postprocess(outputs, False, **kwargs)
    keys = [f"{uid}_3_0", f"{uid}_3_1"]  # verl's TransferQueue keys
    assert set(keys) <= set(real_tq.kv_list(partition_id="train")["train"])
    # verl copies the final reward to every output, as with its own reward loop
    assert stored(real_tq, keys) == [(score, extra), (score, extra)]
    real_tq.kv_clear(keys=keys, partition_id="train")


async def test_transferqueue_path_keeps_per_output_rewards(
    monkeypatch: pytest.MonkeyPatch, echo_fleet: Fleet, real_tq: ModuleType
) -> None:
    w = tq_worker(monkeypatch, echo_fleet.namespace)
    uid = f"tq-echo-{uuid.uuid4().hex[:8]}"
    outputs = [output("a"), output("bb bb"), output("ccc ccc ccc")]
    expected = [expected_reward(o.response_ids) for o in outputs]
    kwargs: dict[str, Any] = {**row("openai/gsm8k", "42", uid=uid), "session_id": 0, "global_steps": 1}
    await w._agent_loop_postprocess(outputs, False, **kwargs)
    keys = [f"{uid}_0_{i}" for i in range(3)]
    got = stored(real_tq, keys)
    assert [g[0] for g in got] == pytest.approx(expected)  # not the final reward copied three times
    assert [g[1] for g in got] == [{"i": i, "n": 3} for i in range(3)]
    real_tq.kv_clear(keys=keys, partition_id="train")


def one_step_off_config(manager: str | None) -> Any:
    """The one-step-off trainer's own config, composed by Hydra as its main_ppo composes it."""
    from hydra import compose, initialize_config_dir

    base = Path(verl.__file__).parent
    overrides = ["algorithm.adv_estimator=rewardq_grpo"]  # a DataProto trainer: the masking estimator
    if manager:
        overrides.append(f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={manager}")
    cwd = os.getcwd()
    os.chdir(base.parent)  # its defaults name file://verl/trainer/config, relative to verl's parent
    try:
        config_dir = str(base / "experimental" / "one_step_off_policy" / "config")
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose(config_name="one_step_off_ppo_trainer", overrides=overrides)
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("manager", [MANAGER, None])
def test_one_step_off_trainer_builds_the_manager_it_is_given(
    monkeypatch: pytest.MonkeyPatch, real_tq: ModuleType, manager: str | None
) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
    from verl.experimental.one_step_off_policy import ray_trainer as one_step_off

    cfg = one_step_off_config(manager)
    assert cfg.trainer.use_v1 is True and cfg.transfer_queue.enable is False  # inherited, yet no TransferQueue
    monkeypatch.setattr(AgentLoopManager, "_init_agent_loop_workers", no_workers)
    monkeypatch.setattr(
        one_step_off.LLMServerManager,
        "create",
        classmethod(lambda cls, config: SimpleNamespace(get_client=lambda: None)),
    )
    trainer = object.__new__(one_step_off.OneStepOffRayTrainer)
    trainer.config, trainer.use_rm = cfg, False
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_workers=["reward-actor"])
    one_step_off.OneStepOffRayTrainer._init_async_rollout_manager(trainer)  # verl's own set-up step
    built = trainer.async_rollout_manager
    assert built.reward_loop_worker_handles == ["reward-actor"]  # the hook's path, if the config names it
    if manager:  # the DataProto trainer: the plain rewardq manager, never the TransferQueue one
        assert type(built) is adapter.RewardqAgentLoopManager
        assert issubclass(worker_class_of(built), adapter.RewardqAgentLoopWorker)
    else:
        assert type(built) is AgentLoopManager and not issubclass(worker_class_of(built), adapter.RewardqScoring)
        assert issubclass(worker_class_of(built), AgentLoopWorker)
