"""Every verl trainer reaches the fleet, through verl's own classes on a local Ray.

One ``rewardq worker --config trainer.yaml`` scores for the whole module, started on the very file
verl's ``RewardLoopManager(config)`` is built from: verl's generated trainer config switched to the
reward-manager hook as a user switches it (``reward.reward_manager.name=rewardq``, the name rewardq's
verl plugin registers in every verl process, Ray's reward-loop actors included) and a Hugging Face
tokenizer folder as ``actor_rollout_ref.model.path``. Every reward is compared with ``default_compute_score`` on the
real final response.

| trainer | path proven here |
|---|---|
| legacy (``use_v1=false``) | hook: verl's ``AgentLoopWorker._compute_score``, ``RewardLoopManager.compute_rm_score`` |
| V1 / TransferQueue | hook: verl's ``AgentLoopWorkerTQ._agent_loop_postprocess`` into the real ``transfer_queue`` |
| one-step-off | agent-loop manager: verl's ``OneStepOffRayTrainer._init_async_rollout_manager`` picks ours |
| fully-async | hook: verl's ``FullyAsyncRollouter`` builds its ``RewardLoopManager`` from the config |

The agent-loop manager on the legacy and V1 trainers is proven in tests/verl/test_managers.py.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker
from verl.experimental.reward_loop import RewardLoopManager
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.protocol import DataProto

from rewardq.integrations.verl import RewardqRewardManager, RewardqScoring
from tests.conftest import REDIS_URL, _delete_namespace
from tests.support.cli_procs import Proc, Procs, wait_for
from tests.support.sync_client import SyncClient
from tests.verl.conftest import FAILING_SCORER
from tests.verl.data import TOK, output, row, verl_expected
from tests.verl.harness import (
    CapturingHandle,
    bare_agent_loop_worker,
    demo_hf_folder,
    end_reward_loop,
    hook_config,
    save_config,
    unique_namespace,
)


@dataclass
class HookRun:
    """The trainer config, the file it was saved to, verl's RewardLoopManager, the worker."""

    config: Any
    path: Path
    manager: Any
    namespace: str
    worker: Proc
    policy_tokenizer: Any


@pytest.fixture(scope="module")
def hook_run(
    local_ray: None, module_procs: Procs, module_redis: SyncClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HookRun]:
    from transformers import AutoTokenizer

    tmp = tmp_path_factory.mktemp("hook")
    folder = demo_hf_folder(tmp / "policy")
    ns = unique_namespace("hook")
    cfg = hook_config(folder, ns)
    # verl's custom reward function: the default scorers, except that a response marked FAIL raises
    cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name = FAILING_SCORER.split(":")
    path = save_config(cfg, tmp / "trainer.yaml")
    name = f"hook-{uuid.uuid4().hex[:6]}"
    worker = module_procs.start(["worker", "--config", str(path), "--name", name, "--log-level", "INFO"], tag=name)
    manager = RewardLoopManager(cfg)  # verl's own: starts reward.num_workers RewardLoopWorker actors
    wait_for(lambda: module_redis.exists(f"{ns}:worker:{name}"), 120, "the --config worker", procs=[worker])
    yield HookRun(cfg, path, manager, ns, worker, AutoTokenizer.from_pretrained(str(folder)))
    end_reward_loop(manager)  # its actors' names are free for the next file's RewardLoopManager
    assert worker.terminate() == 0, worker.stderr()[-3000:]
    _delete_namespace(REDIS_URL, ns)


async def no_workers(self: Any) -> None:
    self.agent_loop_workers = []


def expected_info(outputs: list[AgentLoopOutput], kwargs: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    score, extra = verl_expected(outputs, kwargs)
    return score, {**extra, "reward_error": None, "reward_failure_kind": None}


def sized(prompt_len: int, response_ids: list[int]) -> AgentLoopOutput:
    """An output with a prompt of ``prompt_len`` tokens and the given response."""
    prompt = TOK.encode("Q " * prompt_len)[:prompt_len]
    assert len(prompt) == prompt_len
    return AgentLoopOutput(
        prompt_ids=prompt,
        response_ids=response_ids,
        response_mask=[1] * len(response_ids),
        num_turns=2,
        metrics=AgentLoopMetrics(),
        extra_fields={},
    )


def multi_output(final: str, shapes: list[tuple[int, int]], final_prompt: int) -> list[AgentLoopOutput]:
    """Earlier outputs of (prompt, response) token lengths, then the final response ``final``."""
    earlier = [sized(p, TOK.encode("y " * r)[:r]) for p, r in shapes]
    return [*earlier, sized(final_prompt, TOK.encode(final))]


#: (data source, ground truth, final response, earlier (prompt, response) lengths, final prompt length):
#: final outputs shorter than an earlier one, with prompts shorter and longer than the earlier ones'.
SHAPES = [
    ("openai/gsm8k", "42", "So #### 42", [(50, 30)], 30),
    ("openai/gsm8k", "42", "#### 41", [(60, 40), (10, 5)], 20),
    ("math_dapo", "42", "Working.\nAnswer: 42", [(80, 60)], 70),
    ("lighteval/MATH", "4", "\\boxed{4}", [(40, 50), (45, 20)], 44),
    ("openai/gsm8k", "7", "#### 7", [], 12),  # one output
]


async def test_verls_agent_loop_scores_every_shape_through_the_hook(hook_run: HookRun) -> None:
    w = bare_agent_loop_worker(AgentLoopWorker, hook_run.manager.reward_loop_worker_handles)
    for data_source, truth, final, shapes, final_prompt in SHAPES:
        outputs = multi_output(final, shapes, final_prompt)
        kwargs = row(data_source, truth)
        await AgentLoopWorker._compute_score(w, outputs, kwargs=kwargs)  # verl's own method
        score, info = expected_info(outputs, kwargs)
        assert (outputs[-1].reward_score, outputs[-1].extra_fields["reward_extra_info"]) == (score, info), final


async def test_verls_own_manager_cuts_what_the_hook_reads_whole(hook_run: HookRun) -> None:
    """The same padded batch: verl's naive manager reads a cut final response, the hook the real one."""
    capture = CapturingHandle()
    w = bare_agent_loop_worker(AgentLoopWorker, [capture])
    cut = 0
    for data_source, truth, final, shapes, final_prompt in SHAPES:
        outputs = multi_output(final, shapes, final_prompt)
        kwargs = row(data_source, truth)
        await AgentLoopWorker._compute_score(w, outputs, kwargs=kwargs)
        data = capture.batches[-1]
        verls = await NaiveRewardManager(hook_run.config, hook_run.policy_tokenizer, None).run_single(data)
        ours = await RewardqRewardManager(hook_run.config, hook_run.policy_tokenizer).run_single(data)
        score, info = expected_info(outputs, kwargs)
        assert (ours["reward_score"], ours["reward_extra_info"]) == (score, info)
        cut += verls["reward_score"] != score
    assert cut >= 2  # the shapes above do make verl's arithmetic wrong


def trainer_batch(cases: list[tuple[str, str, str]], width: int = 16, resp_width: int = 24) -> DataProto:
    """A training batch as verl's trainer holds it: prompts left-padded, responses right-padded."""
    prompts, responses, masks = [], [], []
    for _, _, final in cases:
        p, r = TOK.encode("Question?")[-width:], TOK.encode(final)[:resp_width]
        prompts.append([0] * (width - len(p)) + p)
        responses.append(r + [0] * (resp_width - len(r)))
        masks.append([0] * (width - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (resp_width - len(r)))
    rows = [row(ds, truth) for ds, truth, _ in cases]
    non_tensor = {k: np.array([r[k] for r in rows], dtype=object) for k in ("data_source", "reward_model", "uid")}
    non_tensor["extra_info"] = np.array([r["extra_info"] for r in rows], dtype=object)
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor(prompts),
            "responses": torch.tensor(responses),
            "attention_mask": torch.tensor(masks),
        },
        non_tensors=non_tensor,
    )


def test_verls_reward_loop_manager_scores_a_training_batch(hook_run: HookRun) -> None:
    cases = [
        ("openai/gsm8k", "42", "#### 42"),
        ("openai/gsm8k", "42", "#### 40"),
        ("openai/gsm8k", "1", "FAIL #### 1"),  # an error row between scored ones (the reward function raises)
        ("math_dapo", "3", "Answer: 3"),
    ]
    out = hook_run.manager.compute_rm_score(trainer_batch(cases))  # verl's own batch path
    rewards = out.batch["rm_scores"].sum(-1).tolist()
    ok = [c for c in cases if "FAIL" not in c[2]]
    expected = [verl_expected([output(final)], row(ds, truth))[0] for ds, truth, final in ok]
    assert rewards == [*expected[:2], 0.0, expected[2]]
    errors = list(out.non_tensor_batch["reward_error"])
    assert errors[:2] == [None, None] and errors[3] is None and "marked to fail" in errors[2]
    assert list(out.non_tensor_batch["reward_failure_kind"]) == [None, None, "scorer", None]
    assert list(out.non_tensor_batch["acc"])[2] == 0.0


def test_the_worker_read_the_hook_config_as_naive_with_the_policy_tokenizer(hook_run: HookRun) -> None:
    log = hook_run.worker.stderr()
    effective = next(line for line in log.splitlines() if "effective config" in line)
    assert '"manager": "naive"' in effective and str(hook_run.config.actor_rollout_ref.model.path) in effective
    assert "config file: rewardq does not use" not in log  # every key of verl's generated config is known


async def test_v1_transferqueue_trainer_stores_the_hooks_rewards(hook_run: HookRun, real_tq: ModuleType) -> None:
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    tq = real_tq
    cls = AgentLoopWorkerTQ.__ray_metadata__.modified_class
    w = bare_agent_loop_worker(cls, hook_run.manager.reward_loop_worker_handles)
    uid = f"tq-{uuid.uuid4().hex[:8]}"
    outputs = multi_output("Answer: 42", [(40, 30)], 20)
    kwargs: dict[str, Any] = {**row("math_dapo", "42", uid=uid), "session_id": 2, "global_steps": 5}
    await cls._agent_loop_postprocess(w, outputs, False, **kwargs)  # verl's own V1 post-processing
    keys = [f"{uid}_2_0", f"{uid}_2_1"]
    stored = tq.kv_batch_get(keys=keys, partition_id="train")
    score, info = expected_info(outputs, kwargs)
    assert [float(stored["rm_scores"][i].sum()) for i in range(2)] == [score, score]  # verl copies the final one
    assert stored["extra_fields"][1]["reward_extra_info"] == info
    assert set(keys) <= set(tq.kv_list(partition_id="train")["train"])
    tq.kv_clear(keys=keys, partition_id="train")


async def test_fully_async_trainer_builds_its_reward_loop_from_the_config(
    hook_run: HookRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.experimental import reward_loop
    from verl.experimental.fully_async_policy.fully_async_rollouter import (
        FullyAsyncAgentLoopManager,
        FullyAsyncRollouter,
    )

    built: list[Any] = []

    def record(config: Any, rm_resource_pool: Any = None) -> Any:
        built.append(config)
        return hook_run.manager  # the module's RewardLoopManager(config): the actors' names are taken

    monkeypatch.setattr(reward_loop, "RewardLoopManager", record)
    rollouter = object.__new__(FullyAsyncRollouter.__ray_metadata__.modified_class)
    rollouter.config = hook_run.config
    await rollouter._create_reward_loop_manager()  # verl's own fully-async set-up step
    assert built == [hook_run.config] and rollouter.reward_loop_manager is hook_run.manager
    # its agent loops run verl's plain AgentLoopWorker (agent_loop_manager_class is never read) ...
    monkeypatch.setattr(FullyAsyncAgentLoopManager, "_init_agent_loop_workers", no_workers)
    made = FullyAsyncAgentLoopManager.create(
        config=hook_run.config,
        llm_client=None,
        reward_loop_worker_handles=rollouter.reward_loop_manager.reward_loop_workers,
    )
    made = await made if inspect.isawaitable(made) else made
    workers = made.agent_loop_workers_class.__ray_metadata__.modified_class  # Ray's subclass of the class given
    assert issubclass(workers, AgentLoopWorker) and not issubclass(workers, RewardqScoring)
    # ... whose _compute_score sends each trajectory to those reward-loop actors, hence to the fleet
    w = bare_agent_loop_worker(AgentLoopWorker, rollouter.reward_loop_manager.reward_loop_workers)
    outputs = multi_output("#### 42", [(30, 20)], 10)
    kwargs = row("openai/gsm8k", "42")
    await AgentLoopWorker._compute_score(w, outputs, kwargs=kwargs)
    assert (outputs[-1].reward_score, outputs[-1].extra_fields["reward_extra_info"]) == expected_info(outputs, kwargs)
