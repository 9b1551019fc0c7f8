"""The managers verl loads from ``agent_loop_manager_class``, and the TransferQueue path.

verl's V1 trainer (its default) imports the ``transfer_queue`` package, which verl 0.9.1 does
not install by itself; :mod:`tests.verl.tq_stub` stands in for it, recording every put, so verl's
real ``AgentLoopWorkerTQ._agent_loop_postprocess`` runs here on real outputs.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rewardq.integrations import verl as adapter
from tests.conftest import REDIS_URL
from tests.support.managers import expected_reward
from tests.verl import tq_stub
from tests.verl.data import output, row, verl_expected


def config(use_v1: bool):
    return OmegaConf.create(
        {
            "trainer": {"use_v1": use_v1},
            "actor_rollout_ref": {"rollout": {"agent": {"num_workers": 1}}, "model": {"path": "/nowhere"}},
        }
    )


@pytest.fixture
def no_actors(monkeypatch):
    """Managers built without starting Ray actors (verl's _init_agent_loop_workers needs a cluster)."""
    tq_stub.install(monkeypatch)

    async def no_workers(self):
        self.agent_loop_workers = []

    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    monkeypatch.setattr(AgentLoopManager, "_init_agent_loop_workers", no_workers)


def worker_class_of(manager) -> type:
    return manager.agent_loop_workers_class.__ray_metadata__.modified_class


def test_one_override_works_on_both_of_verls_trainers(no_actors):
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


def tq_worker(monkeypatch, namespace: str):
    """A TransferQueue worker whose verl __init__ never ran, as far as _agent_loop_postprocess needs."""
    monkeypatch.setenv("REWARDQ_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("REWARDQ_NAMESPACE", namespace)
    w = object.__new__(adapter.RewardqAgentLoopWorkerTQ)
    w.processor = None  # text-only model: verl's multimodal and position-id helpers take their plain path
    w.distillation_enabled = False
    return w


async def test_transferqueue_path_stores_verls_rewards(monkeypatch, naive_fleet):
    puts = tq_stub.install(monkeypatch)
    w = tq_worker(monkeypatch, naive_fleet.namespace)
    outputs = [output("first turn"), output("Answer: 42", tool="<tool>ok</tool>")]
    kwargs = {**row("math_dapo", "42", uid="tq-uid"), "session_id": 3, "global_steps": 7}
    score, extra = verl_expected(outputs, kwargs)
    await w._agent_loop_postprocess(outputs, False, **kwargs)
    (put,) = puts
    assert put["keys"] == ["tq-uid_3_0", "tq-uid_3_1"]  # verl's TransferQueue keys
    fields = put["fields"]
    for i in range(2):  # verl copies the final reward to every output, as with its own reward loop
        assert float(fields["rm_scores"][i].sum()) == score
        assert fields["extra_fields"][i]["reward_extra_info"] == extra
    assert put["partition_id"] == "train"


async def test_transferqueue_path_keeps_per_output_rewards(monkeypatch, echo_fleet):
    puts = tq_stub.install(monkeypatch)
    w = tq_worker(monkeypatch, echo_fleet.namespace)
    outputs = [output("a"), output("bb bb"), output("ccc ccc ccc")]
    expected = [expected_reward(o.response_ids) for o in outputs]
    kwargs = {**row("openai/gsm8k", "42", uid="tq-echo"), "session_id": 0, "global_steps": 1}
    await w._agent_loop_postprocess(outputs, False, **kwargs)
    fields = puts[0]["fields"]
    stored = [float(fields["rm_scores"][i].sum()) for i in range(3)]
    assert stored == pytest.approx(expected)  # not the final reward copied three times
    assert [fields["extra_fields"][i]["reward_extra_info"] for i in range(3)] == [{"i": i, "n": 3} for i in range(3)]
