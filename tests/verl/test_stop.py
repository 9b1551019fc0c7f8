"""rewardq stops a verl V1 run, which swallows every exception raised in a session, at its next step.

verl's ``AgentLoopWorkerTQ._run_prompt`` gathers a prompt's sessions with ``return_exceptions=True``
and tags the group ``failure``; nothing raised while scoring reaches the trainer. rewardq puts a stop
tag into TransferQueue first (rewardq.integrations.verl.stop), and verl's own
``ReplayBuffer.sample``, which the V1 trainer calls at every step before it takes any group, raises
with rewardq's message. Proven here for each cause (a ``config`` failure, ``verl_on_error=raise``,
the run's failure budget spent), through rewardq's V1 agent-loop worker and through the hook on
verl's own worker, driven by verl's own ``_run_prompt`` and ``_run_agent_loop`` into the real
TransferQueue; and once with the hook in a real reward-loop actor (verl's ``RewardLoopManager``),
which attaches to the run's TransferQueue itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rewardq.integrations.verl.stop import PARTITION, STOP_KEY
from tests.verl import scripted_agent
from tests.verl.conftest import Fleet
from tests.verl.data import row
from tests.verl.harness import bare_agent_loop_worker, demo_hf_folder, end_reward_loop, hook_config, trainer_config
from tests.verl.test_masking import replay_buffer, v1_worker

#: A first use here starts Ray, a verl trainer or a Ray actor importing verl and torch: 100-230 s of
#: set-up beside the main suite's tail in CI, so the tests' 300 s default is too tight.
pytestmark = pytest.mark.timeout(900)

#: cause -> (the prompt's data source, its 4 responses, rewardq settings, what the stop names)
CAUSES: dict[str, tuple[str, list[str], dict[str, Any], str]] = {
    "config": ("no-such-source", ["a", "aa", "aaa", "aaaa"], {}, "no-such-source"),
    "raise": ("custom", ["a", "FAIL", "aa", "aaa"], {"verl_on_error": "raise"}, "verl_on_error=raise"),
    "budget": (
        "custom",
        ["FAIL"] * 4,
        {"verl_max_error_rate": 0.5, "verl_error_window": 4},
        "4 of the run's last 4 trajectories",
    ),
}


@pytest.fixture
def clean_tq(real_tq: ModuleType) -> Iterator[ModuleType]:
    """TransferQueue without a stop tag afterwards: the session's other V1 tests share it."""
    yield real_tq
    real_tq.kv_clear(keys=[STOP_KEY], partition_id=PARTITION)


async def run_prompt(w: Any, tq: ModuleType, data_source: str, responses: list[str]) -> str:
    """One prompt as verl's V1 trainer runs it: its tag, then verl's own ``_run_prompt``."""
    uid = str(uuid.uuid4())
    scripted_agent.RESPONSES[uid] = responses
    tq.kv_batch_put(
        keys=[uid], partition_id="train", tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}]
    )
    prompt = {**row(data_source, "x", uid=uid), "global_steps": 1, "agent_name": scripted_agent.NAME}
    trajectory = {"validate": False, "step": 1, "sample_index": 0, "rollout_n": len(responses)}
    await type(w)._run_prompt(w, prompt, {}, trajectory=trajectory, trace=False)  # verl's: it raises nothing
    return uid


def assert_the_next_step_stops(tq: ModuleType, uid: str, names: str) -> None:
    assert tq.kv_list(partition_id="train")["train"][uid]["status"] == "failure"  # verl swallowed the raise
    with pytest.raises(ValueError, match="Unknown status: rewardq: ") as stopped:
        replay_buffer(1).sample(global_steps=1, partition_id="train", batch_size=1)  # the V1 trainer's step
    assert names in str(stopped.value) and "_run_prompt swallows it" in str(stopped.value)


@pytest.mark.parametrize("cause", CAUSES)
@pytest.mark.parametrize("path", ["agent-loop", "hook"])
async def test_the_v1_trainers_next_step_raises_rewardqs_stop(
    failing_fleet: Fleet, clean_tq: ModuleType, path: str, cause: str
) -> None:
    data_source, responses, settings, names = CAUSES[cause]
    w = v1_worker(path, trainer_config(failing_fleet.namespace, "grpo", v1=True, **settings))
    uid = await run_prompt(w, clean_tq, data_source, responses)
    try:
        assert_the_next_step_stops(clean_tq, uid, names)
    finally:
        clean_tq.kv_clear(keys=[uid], partition_id="train")


async def test_a_v1_run_without_a_stop_samples_as_verl_does(failing_fleet: Fleet, clean_tq: ModuleType) -> None:
    """The control: the same worker and a healthy prompt; the replay buffer hands the group over."""
    w = v1_worker("agent-loop", trainer_config(failing_fleet.namespace, "grpo", v1=True))
    uid = await run_prompt(w, clean_tq, "custom", ["a", "aa"])
    try:
        batch, _ = replay_buffer(1).sample(global_steps=1, partition_id="train", batch_size=1)
        assert sorted(k.rsplit("_", 2)[1] for k in batch.keys) == ["0", "1"]
        clean_tq.kv_clear(keys=list(batch.keys), partition_id="train")
    finally:
        clean_tq.kv_clear(keys=[uid], partition_id="train")


async def test_the_hook_in_verls_reward_loop_actor_stops_the_v1_trainer(
    failing_fleet: Fleet, clean_tq: ModuleType, tmp_path: Path
) -> None:
    from verl.experimental.reward_loop import RewardLoopManager
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    cfg = hook_config(demo_hf_folder(tmp_path / "policy"), failing_fleet.namespace, num_workers=1)
    cfg.transfer_queue.enable = True  # what verl's V1 task runner sets
    manager = RewardLoopManager(cfg)  # verl's own: a RewardLoopWorker actor loading the hook
    try:
        w = bare_agent_loop_worker(AgentLoopWorkerTQ.__ray_metadata__.modified_class, manager.reward_loop_workers)
        w.config = cfg
        w.llm_client, w.hf_model_type, w.dataset_cls, w.tools = None, None, None, []
        uid = await run_prompt(w, clean_tq, "no-such-source", ["a", "aa"])
        try:
            assert_the_next_step_stops(clean_tq, uid, "no-such-source")
        finally:
            clean_tq.kv_clear(keys=[uid], partition_id="train")
    finally:
        end_reward_loop(manager)
