"""``verl_on_error=mask``: a failed sample contributes nothing, through verl's own machinery.

GRPO groups are scored by a real fleet (``rewardq worker`` processes, real Redis) whose reward
function raises for responses marked ``FAIL`` (tests/verl/failing_scorer.py). Groups of 4: one with
1 failure, one with 2, one with none, one with 3 (left with one scored sample).

* DataProto trainers (legacy, one-step-off, fully-async), through the agent-loop manager's worker
  and through the hook (verl's own ``AgentLoopWorker._compute_score`` and ``_postprocess``), then
  verl's own ``compute_advantage`` with ``rewardq_<estimator>``: every healthy sample's advantage is
  what verl's ``<estimator>`` computes on the batch with the failed samples removed (1e-6); every
  failed sample, and the lone survivor, has advantage 0 and ``response_mask`` 0 in the batch.
* The V1 trainer, through verl's own ``AgentLoopWorkerTQ._run_prompt`` into the real TransferQueue,
  verl's ``ReplayBuffer.sample`` and ``compute_advantage_for_multi_trajectories`` with verl's own
  ``grpo``: the failed sessions never reach the batch, and the healthy ones get verl's GRPO over the
  healthy ones.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos, ray_trainer
from verl.trainer.ppo.ray_trainer import compute_advantage

from rewardq.errors import ConfigError
from rewardq.integrations.verl import RewardqAgentLoopManager, RewardqAgentLoopWorker, RewardqRewardManager
from rewardq.integrations.verl import metrics as verl_metrics
from rewardq.integrations.verl.policy import MASKABLE, SETUP_HOOK, SETUP_HOOK_KEY, masking_refusal
from rewardq.integrations.verl.settings import settings_for
from tests.support.cli_procs import REPO
from tests.verl import scripted_agent
from tests.verl.conftest import Fleet
from tests.verl.data import internal, output, row
from tests.verl.harness import LocalHandle, bare_agent_loop_worker, trainer_config

#: A first use here starts Ray, a verl trainer or a Ray actor importing verl and torch: 100-230 s of
#: set-up beside the main suite's tail in CI, so the tests' 300 s default is too tight.
pytestmark = pytest.mark.timeout(900)

#: Per group, its 4 responses; ``FAIL`` marks the samples whose reward function raises.
GROUPS = [
    ["aaaa", "a FAIL", "aa", "aaaaaaa"],  # 1 failed
    ["FAIL", "aaa", "FAIL aa", "a"],  # 2 failed
    ["a", "aa", "aaaaa", "aaa"],  # none
    ["FAIL a", "aaaa", "FAIL", "FAIL aaaaaa"],  # 3 failed: one scored sample left
]


def hook(cfg: Any) -> RewardqRewardManager:
    """The hook as verl's reward loop builds it (no policy tokenizer here: no fingerprint is sent)."""
    return RewardqRewardManager(cfg, None)  # type: ignore[arg-type]


def expected(response: str) -> float:
    return math.nan if "FAIL" in response else response.count("a") / 4.0


async def score_groups(path: str, cfg: Any) -> tuple[list[AgentLoopOutput], list[str]]:
    """Every sample of :data:`GROUPS`, scored through ``path`` as verl's agent loop scores it."""
    if path == "agent-loop":
        w: Any = object.__new__(RewardqAgentLoopWorker)
        w.config = cfg
    else:
        w = bare_agent_loop_worker(AgentLoopWorker, [LocalHandle(hook(cfg))])
    finals, uids = [], []
    for g, responses in enumerate(GROUPS):
        uid = f"g{g}-{uuid.uuid4().hex[:6]}"
        for text in responses:
            outputs = [output(text)]
            await type(w)._compute_score(w, outputs, kwargs=row("custom", "x", uid=uid, index=g))
            finals.append(outputs[-1])
            uids.append(uid)
    return finals, uids


def dataproto_batch(finals: list[AgentLoopOutput], uids: list[str], path: str) -> DataProto:
    """The batch verl's legacy trainer holds before ``compute_advantage``."""
    cls = RewardqAgentLoopWorker if path == "agent-loop" else AgentLoopWorker
    bare: Any = object.__new__(cls)
    bare.reward_loop_worker_handles = None
    batch: DataProto = cls._postprocess(bare, [internal(o.model_copy(deep=True)) for o in finals])
    batch.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    batch.batch["token_level_scores"] = batch.batch["rm_scores"]
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]  # fit does this without KL in reward
    return batch


@pytest.mark.parametrize("path", ["agent-loop", "hook"])
@pytest.mark.parametrize("estimator", MASKABLE)
async def test_failed_samples_contribute_nothing_on_a_dataproto_trainer(
    failing_fleet: Fleet, path: str, estimator: str
) -> None:
    cfg = trainer_config(failing_fleet.namespace, f"rewardq_{estimator}")
    finals, uids = await score_groups(path, cfg)
    rewards = [o.reward_score for o in finals]
    flat = [t for group in GROUPS for t in group]
    assert [float("nan") if r is None else r for r in rewards] == pytest.approx(
        [expected(t) for t in flat], nan_ok=True
    )
    failed = [i for i, t in enumerate(flat) if "FAIL" in t]
    lone = [i for i, t in enumerate(flat) if i // 4 == 3 and "FAIL" not in t]  # group 3's one scored sample
    healthy = [i for i in range(len(flat)) if i not in failed and i not in lone]
    kinds = [
        o.extra_fields.get("reward_failure_kind") or o.extra_fields["reward_extra_info"].get("reward_failure_kind")
        for o in finals
    ]
    assert all(kinds[i] is not None for i in failed) and all(kinds[i] is None for i in healthy + lone)

    batch = dataproto_batch(finals, uids, path)
    # the batch without the failed samples, and without the group they left with one scored sample
    reference = dataproto_batch(finals, uids, path).select_idxs(healthy)
    mask_before = batch.batch["response_mask"].clone()
    out = compute_advantage(
        batch, adv_estimator=f"rewardq_{estimator}", norm_adv_by_std_in_grpo=True, config=cfg.algorithm
    )
    ref = compute_advantage(reference, adv_estimator=estimator, norm_adv_by_std_in_grpo=True, config=cfg.algorithm)

    for n, i in enumerate(healthy):  # verl's own estimator on the batch without the failed samples
        torch.testing.assert_close(out.batch["advantages"][i], ref.batch["advantages"][n], atol=1e-6, rtol=0)
        assert torch.equal(out.batch["response_mask"][i], mask_before[i])
    for i in failed + lone:  # no advantage, no token in the loss (the batch's own mask, which the actor reads)
        assert not out.batch["advantages"][i].any() and not out.batch["response_mask"][i].any()
    # a failed sample keeps its NaN ("no reward"); verl's step metrics, where its trainer computes them,
    # take verl's reward figures over the scored samples and add rewardq's
    assert torch.isnan(out.batch["token_level_scores"][failed].sum(-1)).all()
    verl_metrics.install()
    figures = ray_trainer.compute_data_metrics(batch=out, use_critic=False)
    scored = [i for i in range(len(flat)) if i not in failed]
    assert figures["critic/score/mean"] == pytest.approx(float(np.mean([expected(flat[i]) for i in scored])))
    assert figures["critic/score/min"] == min(expected(flat[i]) for i in scored)
    assert all(math.isfinite(v) for k, v in figures.items() if k.startswith("critic/"))
    assert figures["rewardq/masked"] == len(failed + lone)
    assert figures["rewardq/masked_share"] == len(failed + lone) / 16
    assert figures["rewardq/failures/scorer"] == len(failed)


async def test_kl_in_reward_keeps_the_failed_samples_out(failing_fleet: Fleet) -> None:
    """``algorithm.use_kl_in_reward``: verl's ``apply_kl_penalty`` runs before the estimator and makes
    ``token_level_rewards`` a new tensor (scores - beta * KL); the failed rows stay NaN there, the
    estimator leaves them out, and verl's KL figures and reward metrics stay finite."""
    cfg = trainer_config(failing_fleet.namespace, "rewardq_grpo")
    finals, uids = await score_groups("agent-loop", cfg)
    flat = [t for group in GROUPS for t in group]
    failed = [i for i, t in enumerate(flat) if "FAIL" in t]
    healthy = [i for i in range(len(flat)) if i not in failed and i // 4 != 3]

    def with_kl() -> tuple[DataProto, dict[str, float]]:
        batch = dataproto_batch(finals, uids, "agent-loop")
        gen = torch.Generator().manual_seed(7)
        shape = batch.batch["response_mask"].shape
        batch.batch["old_log_probs"] = -torch.rand(shape, generator=gen)
        batch.batch["ref_log_prob"] = -torch.rand(shape, generator=gen)
        penalised: tuple[DataProto, dict[str, float]] = ray_trainer.apply_kl_penalty(
            batch, core_algos.FixedKLController(0.1), "kl"
        )
        return penalised

    batch, kl_metrics = with_kl()
    assert all(math.isfinite(v) for v in kl_metrics.values())
    assert torch.isnan(batch.batch["token_level_rewards"][failed].sum(-1)).all()
    out = compute_advantage(batch, adv_estimator="rewardq_grpo", config=cfg.algorithm)
    reference, _ = with_kl()
    ref = compute_advantage(reference.select_idxs(healthy), adv_estimator="grpo", config=cfg.algorithm)
    for n, i in enumerate(healthy):
        torch.testing.assert_close(out.batch["advantages"][i], ref.batch["advantages"][n], atol=1e-6, rtol=0)
    assert not out.batch["advantages"][failed].any() and not out.batch["response_mask"][failed].any()
    verl_metrics.install()
    figures = ray_trainer.compute_data_metrics(batch=out, use_critic=False)
    assert all(math.isfinite(v) for k, v in figures.items() if k.startswith("critic/"))


async def test_with_zero_verls_reward_figures_are_verls_own(failing_fleet: Fleet) -> None:
    """``verl_on_error=zero`` trains failed samples on 0.0, so verl's figures count them as verl does."""
    cfg = trainer_config(failing_fleet.namespace, "grpo", verl_on_error="zero")
    finals, uids = await score_groups("agent-loop", cfg)
    assert sum(o.reward_score == 0.0 and o.extra_fields["reward_failure_kind"] == "scorer" for o in finals) == 6
    out = compute_advantage(dataproto_batch(finals, uids, "agent-loop"), adv_estimator="grpo", config=cfg.algorithm)
    verl_metrics.install()
    ours = ray_trainer.compute_data_metrics(batch=out, use_critic=False)
    verls = ray_trainer.compute_data_metrics.__wrapped__(batch=out, use_critic=False)
    assert {k: v for k, v in ours.items() if not k.startswith("rewardq/")} == verls
    assert ours["rewardq/failures/scorer"] == 6 and ours["rewardq/masked"] == 0


async def test_a_batch_without_failures_gets_verls_own_advantages_bit_for_bit(failing_fleet: Fleet) -> None:
    cfg = trainer_config(failing_fleet.namespace, "rewardq_grpo")
    finals, uids = await score_groups("agent-loop", cfg)
    ok = [i for i, o in enumerate(finals) if o.reward_score is not None and not math.isnan(o.reward_score)]
    batch = dataproto_batch([finals[i] for i in ok], [uids[i] for i in ok], "agent-loop")
    twin = dataproto_batch([finals[i] for i in ok], [uids[i] for i in ok], "agent-loop")
    ours = compute_advantage(batch, adv_estimator="rewardq_grpo", config=cfg.algorithm)
    verls = compute_advantage(twin, adv_estimator="grpo", config=cfg.algorithm)
    assert torch.equal(ours.batch["advantages"], verls.batch["advantages"])


def test_a_configuration_that_cannot_mask_is_refused_at_start(failing_fleet: Fleet) -> None:
    cfg = trainer_config(failing_fleet.namespace, "grpo")
    with pytest.raises(ConfigError, match="set algorithm.adv_estimator=rewardq_grpo"):
        RewardqAgentLoopManager(config=cfg, llm_client=None)  # in the trainer's process, at start
    for estimator in ("gae", "remax", "gdpo"):
        refusal = masking_refusal(settings_for(trainer_config("x", estimator)), trainer_config("x", estimator))
        assert refusal is not None and "rewardq_grpo" in refusal and "verl_on_error=zero" in refusal
    v1 = trainer_config("x", "rewardq_grpo", v1=True)
    assert "algorithm.adv_estimator=grpo" in str(masking_refusal(settings_for(v1), v1))
    assert (
        masking_refusal(settings_for(trainer_config("x", "grpo", v1=True)), trainer_config("x", "grpo", v1=True))
        is None
    )
    zero = trainer_config("x", "gae", verl_on_error="zero")
    assert masking_refusal(settings_for(zero), zero) is None


def test_verls_fully_async_trainer_needs_the_estimators_registered_at_worker_start() -> None:
    cfg = trainer_config("x", "rewardq_grpo")
    assert masking_refusal(settings_for(cfg), cfg) is None  # legacy, one-step-off: rewardq is imported there
    cfg.async_training = {"staleness_threshold": 0.1}  # verl's fully-async trainer config
    refusal = str(masking_refusal(settings_for(cfg), cfg))
    assert f"+{SETUP_HOOK_KEY}={SETUP_HOOK}" in refusal and "Unknown advantage estimator simply" in refusal
    cfg.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook = SETUP_HOOK
    assert masking_refusal(settings_for(cfg), cfg) is None


SETUP_HOOK_RUN = """
import json, sys, ray
ray.init(address="local", include_dashboard=False, num_cpus=1, _temp_dir=sys.argv[1], log_to_driver=False,
         runtime_env={"worker_process_setup_hook": sys.argv[2], "env_vars": {"PYTHONPATH": sys.argv[3]}})

@ray.remote
def seen():  # a fresh worker process, as verl's fully-async trainer actor is
    from verl.trainer.ppo import core_algos
    return {"registered": sorted(k for k in core_algos.ADV_ESTIMATOR_REGISTRY if k.startswith("rewardq_")),
            "hook_module": "rewardq.integrations.verl.entrypoints" in sys.modules}

print(json.dumps(ray.get(seen.remote())))
ray.shutdown()
"""


def test_the_setup_hook_registers_the_estimators_in_a_fresh_ray_worker(tmp_path: Path) -> None:
    """``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=...``: verl's ``run_ppo`` passes
    ``ray_kwargs.ray_init`` to ``ray.init`` as here."""
    temp = Path(tempfile.mkdtemp(prefix="rq-hook-", dir="/tmp"))  # short: Ray's socket paths have a limit
    try:
        run = subprocess.run(
            [sys.executable, "-c", SETUP_HOOK_RUN, str(temp), SETUP_HOOK, str(REPO)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["registered"] == sorted(f"rewardq_{name}" for name in MASKABLE)
    assert seen["hook_module"] is False  # the estimators alone, not the hook's heavier module


def test_the_earlier_setup_hook_path_still_names_the_same_hook() -> None:
    """Running fully-async configs name ``rewardq.integrations.verl_mask.register``: Ray imports the
    module and calls that name, as it does for :data:`SETUP_HOOK`."""
    old_module, _, old_name = "rewardq.integrations.verl_mask.register".rpartition(".")
    new_module, _, new_name = SETUP_HOOK.rpartition(".")
    assert getattr(importlib.import_module(old_module), old_name) is getattr(
        importlib.import_module(new_module), new_name
    )


def test_the_metrics_wrappers_are_installed_once() -> None:
    from verl.trainer.ppo import metric_utils

    verl_metrics.install()
    first = ray_trainer.compute_data_metrics, ray_trainer.process_validation_metrics
    verl_metrics.install()
    verl_metrics.install()
    assert (ray_trainer.compute_data_metrics, ray_trainer.process_validation_metrics) == first
    assert ray_trainer.compute_data_metrics.__wrapped__ is metric_utils.compute_data_metrics  # one layer
    assert ray_trainer.process_validation_metrics.__wrapped__ is metric_utils.process_validation_metrics
    assert not hasattr(metric_utils.compute_data_metrics, "_rewardq")  # verl's own module untouched


def test_validation_metrics_are_taken_over_the_scored_samples() -> None:
    """verl's DataProto trainers' ``_val_metrics_update`` (legacy, one-step-off, the fully-async
    rollouter) after rewardq's wrapper: a failed sample's NaN reward is left out, not averaged in."""
    verl_metrics.install()
    sources = np.array(["openai/gsm8k"] * 4 + ["math"] * 4, dtype=object)
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]
    rewards = [1.0, math.nan, 0.0, 1.0, math.nan, math.nan, 1.0, 0.0]
    infos = {"reward": rewards, "acc": [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]}
    bare: Any = object.__new__(ray_trainer.RayPPOTrainer)
    ours = ray_trainer.RayPPOTrainer._val_metrics_update(bare, sources, uids, infos, [])
    keep = [i for i, r in enumerate(rewards) if not math.isnan(r)]
    scored = {k: [v[i] for i in keep] for k, v in infos.items()}
    # verl's own on the scored samples alone (nothing for the wrapper to leave out)
    reference = ray_trainer.RayPPOTrainer._val_metrics_update(bare, sources[keep], [uids[i] for i in keep], scored, [])
    assert ours == reference and "val-core/openai/gsm8k/acc/mean@2" in ours
    assert all(math.isfinite(float(v)) for v in ours.values())
    unwrapped = ray_trainer.process_validation_metrics.__wrapped__(sources, uids, infos)  # verl's, unwrapped
    assert math.isnan(unwrapped["openai/gsm8k"]["reward"]["mean@2"])  # what verl alone would log


async def test_the_hook_refuses_an_estimator_that_cannot_mask_at_its_first_trajectory(failing_fleet: Fleet) -> None:
    from rewardq.errors import RunStopped

    cfg = trainer_config(failing_fleet.namespace, "grpo")
    w = bare_agent_loop_worker(AgentLoopWorker, [LocalHandle(hook(cfg))])
    with pytest.raises(RunStopped, match="rewardq_grpo"):
        await AgentLoopWorker._compute_score(w, [output("aa")], kwargs=row("custom", "x"))  # a healthy one


# -- V1 ----------------------------------------------------------------------------------------


def v1_worker(path: str, cfg: Any) -> Any:
    """verl's V1 agent-loop worker (rewardq's, or verl's own with the hook), without its LLM servers:
    verl's own ``_run_prompt`` and ``_run_agent_loop`` run the scripted agent loop."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from rewardq.integrations.verl import RewardqAgentLoopWorkerTQ

    cls = RewardqAgentLoopWorkerTQ if path == "agent-loop" else AgentLoopWorkerTQ.__ray_metadata__.modified_class
    w = bare_agent_loop_worker(cls, None if path == "agent-loop" else [LocalHandle(hook(cfg))])
    w.config = cfg
    w.llm_client, w.hf_model_type, w.dataset_cls, w.tools = None, None, None, []
    return w


async def run_prompts(tq: ModuleType, w: Any, groups: list[list[str]], step: int) -> list[str]:
    """What the V1 trainer does for each prompt (its tag), then verl's own ``_run_prompt``."""
    uids = []
    for g, texts in enumerate(groups):
        uid = str(uuid.uuid4())
        scripted_agent.RESPONSES[uid] = texts
        tq.kv_batch_put(
            keys=[uid], partition_id="train", tags=[{"is_prompt": True, "status": "pending", "global_steps": step}]
        )
        prompt = {**row("custom", "x", uid=uid, index=g), "global_steps": step, "agent_name": scripted_agent.NAME}
        trajectory = {"validate": False, "step": step, "sample_index": g, "rollout_n": len(texts)}
        await type(w)._run_prompt(w, prompt, {}, trajectory=trajectory, trace=False)
        uids.append(uid)
    return uids


def replay_buffer(groups: int, cls: Any = None) -> Any:
    """verl's replay buffer as the V1 trainer builds it (``ReplayBuffer`` in the default sync mode)."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    return (cls or ReplayBuffer)(
        trainer_mode="sync",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
        poll_interval=0.1,
        train_batch_size=groups,
        gen_batch_size=groups,
    )


#: The V1 groups: :data:`GROUPS`, then groups where an agent loop raised (``RAISE``) before any reward.
V1_GROUPS = [*GROUPS, ["RAISE", "aa", "aaa", "FAIL"], ["RAISE", "aa", "FAIL a", "RAISE"]]


def v1_metrics_batch(tq: ModuleType, keys: list[str], advantages: torch.Tensor) -> DataProto:
    """The batch verl's V1 trainer hands ``compute_data_metrics`` (trainer_base, after the update)."""
    fields = ["prompts", "responses", "response_mask", "rm_scores"]
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=fields)
    prompt_length, response_length = data["prompts"].offsets().diff(), data["responses"].offsets().diff()
    data = data.to_padded_tensor()
    data["token_level_scores"] = data["token_level_rewards"] = data["rm_scores"]
    data["advantages"] = data["returns"] = advantages
    data["prompt_length"], data["response_length"] = prompt_length.float(), response_length.float()
    return DataProto(batch=data)


class V1Trainer:
    """Stands for verl's V1 trainer where it asks for the step's metrics: the method's ``self.config``
    is the trainer's config (what rewardq reads its settings from when only the hook is in use)."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def step_metrics(self, batch: DataProto) -> dict[str, Any]:
        from verl.trainer.ppo.v1 import trainer_base

        verl_metrics.install()
        return dict(trainer_base.compute_data_metrics(batch=batch, use_critic=False))


@pytest.mark.parametrize("path", ["agent-loop", "hook"])
async def test_failed_sessions_never_reach_the_v1_batch(
    failing_fleet: Fleet, real_tq: ModuleType, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    tq = real_tq
    cfg = trainer_config(failing_fleet.namespace, "grpo", v1=True)
    w = v1_worker(path, cfg)
    uids = await run_prompts(tq, w, V1_GROUPS, step=1)
    tags = tq.kv_list(partition_id="train")["train"]
    # rewardq's worker leaves a failed session out quietly when its group keeps others (verl tags the prompt
    # finished); on verl's own worker (the hook) a failed session raises, and verl tags the prompt failure
    partial = "finished" if path == "agent-loop" else "failure"
    notes = [r for r in caplog.records if "agent_loop_manager_class=rewardq" in r.getMessage()]
    assert len(notes) == (0 if path == "agent-loop" else 1)  # the hook says once what it costs, and the fix
    assert [tags[u]["status"] for u in uids] == [partial, partial, "finished", "failure", "failure", "failure"]
    # verl's asynchronous replay buffer (trainer_mode colocate_async / separate_async) evicts every failure
    # group whole and generates it again: with the hook, a failed sample costs its group's healthy ones
    async_buffer = replay_buffer(len(V1_GROUPS), ReplayBufferAsync)
    assert async_buffer.get_sampleable_count(1, "train") == (3 if path == "agent-loop" else 1)
    # verl's step (the default, sync trainer mode): the replay buffer's sample
    batch, _ = replay_buffer(len(V1_GROUPS)).sample(global_steps=1, partition_id="train", batch_size=len(V1_GROUPS))
    try:
        scored = {
            (u, s) for u, texts in zip(uids, V1_GROUPS) for s, t in enumerate(texts) if t != "RAISE" and "FAIL" not in t
        }
        lone = {(u, s) for u, s in scored if sum(us[0] == u for us in scored) == 1}  # groups 3 and 5
        assert len(lone) == 2
        # rewardq's V1 worker leaves a lone scored session out with its group; verl's own worker (the
        # hook's path) cannot be told to, and keeps verl's rule (docs/verl-integration.md)
        healthy = scored - lone if path == "agent-loop" else scored
        assert {(k.rsplit("_", 2)[0], int(k.rsplit("_", 2)[1])) for k in batch.keys} == healthy
        # verl's V1 advantage step (trainer_base._compute_advantage) on what the replay buffer gave
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id="train", select_fields=["uid", "response_mask", "rm_scores"]
        )
        data = DataProto(batch=data.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        data = compute_advantage_for_multi_trajectories(
            data, batch_keys=batch.keys, adv_estimator="grpo", config=cfg.algorithm
        )
        got = {}
        for row_i, key in enumerate(batch.keys):
            uid, session, _ = key.rsplit("_", 2)
            first = int(data.batch["response_mask"][row_i].argmax())
            got[(uid, int(session))] = float(data.batch["advantages"][row_i, first])
        # verl's GRPO over the stored samples alone
        order = sorted(healthy, key=lambda us: (uids.index(us[0]), us[1]))
        scores = torch.tensor([[expected(V1_GROUPS[uids.index(u)][s])] for u, s in order])
        ref, _ = core_algos.compute_grpo_outcome_advantage(
            scores, torch.ones_like(scores), np.array([u for u, _ in order], dtype=object)
        )
        for (u, s), adv in zip(order, ref[:, 0].tolist()):
            assert got[(u, s)] == pytest.approx(adv, abs=1e-6)

        # the step's metrics, where verl's V1 trainer computes them: rewardq's figures from the run's totals
        figures = V1Trainer(cfg).step_metrics(v1_metrics_batch(tq, list(batch.keys), data.batch["advantages"]))
        failed = sum("FAIL" in t for texts in V1_GROUPS for t in texts)
        dropped = len(lone) if path == "agent-loop" else 0
        assert figures["rewardq/failures/scorer"] == failed and figures["rewardq/masked"] == failed + dropped
        assert figures["rewardq/masked_share"] == pytest.approx((failed + dropped) / (failed + len(scored)))
        assert figures["critic/score/mean"] == pytest.approx(float(scores.mean()))  # verl's own figure
        again = V1Trainer(cfg).step_metrics(v1_metrics_batch(tq, list(batch.keys), data.batch["advantages"]))
        assert again["rewardq/masked"] == 0 and again["rewardq/masked_share"] == 0.0  # nothing new since
    finally:
        tq.kv_clear(keys=list(batch.keys), partition_id="train")
