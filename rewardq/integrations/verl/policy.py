"""What ``verl_on_error`` does on each verl trainer, and the configurations that cannot mask; no verl import.

``mask`` (the default) leaves a sample whose reward failed out of training. How depends on the
trainer (:func:`trainer_kind`):

* **V1** (``trainer.use_v1``, verl's default; its task runner turns ``transfer_queue.enable`` on):
  the sample's session raises :class:`~rewardq.errors.SampleMasked` and is never stored in
  TransferQueue; verl's advantage step groups only the sessions present, so the failed sample has
  no tokens in the loss and no part in its group's baseline with verl's own estimators
  (``algorithm.adv_estimator`` unchanged). rewardq's V1 agent-loop worker decides a prompt's
  sessions together (:mod:`rewardq.integrations.verl.groups`); through the hook, verl's own worker
  keeps its rules (:func:`hook_on_v1_note`).
* **DataProto trainers** (legacy, one-step-off, fully-async): every sample stays in the batch, so
  the failed one gets the reward NaN ("no reward") and the advantage estimator
  ``rewardq_<name>`` (:mod:`rewardq.integrations.verl.mask`) takes it out: its tokens leave the
  loss (``response_mask`` 0), the group's statistics are those of its scored samples, and a group
  left with fewer than two scored samples contributes nothing. That is the one verl key to set:
  ``algorithm.adv_estimator=rewardq_grpo`` (or ``rewardq_rloo``, ...); the fully-async trainer
  also needs the estimators registered at its workers' start (:data:`SETUP_HOOK`).

:func:`masking_refusal` says why a configuration cannot mask (a DataProto trainer with verl's
own estimator, an estimator rewardq has no masking form of, the fully-async trainer without the
setup hook, no trainer config to tell), so the adapter and the hook stop the run at start or at
the first trajectory instead of letting a NaN or a zero into training.
"""

from __future__ import annotations

from typing import Any

from rewardq.adapter_settings import AdapterSettings
from rewardq.integrations.verl.settings import config_at

#: verl's estimators that have a masking form, ``rewardq_<name>``: every one that takes only the
#: rewards, the mask, the groups (``index``) and the algorithm config, so leaving samples out is
#: calling it on the scored ones (tests/verl/test_masking.py checks each against verl on the batch
#: with the failed samples removed). GAE (values), REMAX (a greedy baseline rollout), GDPO (the
#: non-tensor batch) and the optimal-token baselines (actor statistics) take more and have none.
MASKABLE = (
    "grpo",
    "grpo_vectorized",
    "rloo",
    "rloo_vectorized",
    "opo",
    "grpo_passk",
    "reinforce_plus_plus_baseline",
    "reinforce_plus_plus",
    "gpg",
)
#: The prefix of the masking estimators' names.
PREFIX = "rewardq_"
#: The trainer kinds :func:`trainer_kind` tells apart.
V1, DATAPROTO = "v1", "dataproto"
#: Ray's start-up hook that registers the masking estimators in every worker process: what verl's
#: fully-async trainer needs (its advantage step runs where rewardq is never imported otherwise).
SETUP_HOOK = "rewardq.integrations.verl.mask.register"
SETUP_HOOK_KEY = "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"


def trainer_kind(config: object) -> str | None:
    """``v1`` for verl's V1 (TransferQueue) trainer, ``dataproto`` for the others, None without a config.

    verl's V1 task runner sets ``transfer_queue.enable = True`` before it builds anything;
    ``trainer.use_v1`` alone does not tell (the one-step-off trainer inherits ``use_v1: true`` but
    runs the DataProto trainer).
    """
    if config is None:
        return None
    return V1 if bool(config_at(config, "transfer_queue.enable")) else DATAPROTO


def estimator_of(config: object) -> str:
    """The config's ``algorithm.adv_estimator`` (verl's default ``gae`` when absent)."""
    value: Any = config_at(config, "algorithm.adv_estimator")
    return str(getattr(value, "value", value) or "gae")


def masking_refusal(settings: AdapterSettings, config: object) -> str | None:
    """Why ``settings.on_error`` cannot work with this trainer config, or None when it can."""
    if settings.on_error != "mask":
        return None
    kind = trainer_kind(config)
    fix_zero = "or set verl_on_error=zero (failures score 0.0) or raise (the first failure stops the run)"
    if kind is None:
        return (
            "rewardq: verl_on_error=mask needs the trainer's config to know how to leave a failed sample out of "
            f"training, and this adapter has none (no self.config); give it the trainer's config, {fix_zero}"
        )
    estimator = estimator_of(config)
    if kind == V1:
        if estimator.startswith(PREFIX):
            return (
                f"rewardq: algorithm.adv_estimator={estimator} is for verl's DataProto trainers; on the V1 trainer "
                f"a failed sample's session never reaches TransferQueue, so keep verl's own estimator: set "
                f"algorithm.adv_estimator={estimator.removeprefix(PREFIX)}"
            )
        return None
    if estimator.startswith(PREFIX) and estimator.removeprefix(PREFIX) in MASKABLE:
        return _fully_async_refusal(config, estimator)
    if estimator in MASKABLE:
        how = f"set algorithm.adv_estimator={PREFIX}{estimator}"
    else:
        how = f"choose one of {', '.join(PREFIX + m for m in MASKABLE)} as algorithm.adv_estimator"
    return (
        f"rewardq: verl_on_error=mask cannot leave failed samples out of training with algorithm.adv_estimator="
        f"{estimator} on this trainer (it keeps every sample in the batch, and verl's {estimator} would take a "
        f"failed sample's reward into its group's baseline): {how} (rewardq's masking form of it), {fix_zero}"
    )


def _fully_async_refusal(config: object, estimator: str) -> str | None:
    """Why verl's fully-async trainer (its config has ``async_training``) would not find ``estimator``,
    or None: its trainer process imports no rewardq class, so the estimators must be registered at
    every Ray worker's start."""
    if config_at(config, "async_training") is None:
        return None
    hook = config_at(config, SETUP_HOOK_KEY)
    if isinstance(hook, str) and hook.startswith("rewardq."):
        return None
    return (
        f"rewardq: verl's fully-async trainer computes advantages in a process that never imports rewardq, so it "
        f"would stop at its first step with 'Unknown advantage estimator simply: {estimator}'. Register rewardq's "
        f"estimators at every Ray worker's start: +{SETUP_HOOK_KEY}={SETUP_HOOK}"
    )


#: The agent-loop manager override that masks a failed sample alone on the V1 trainer.
AGENT_LOOP_MANAGER = (
    "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=rewardq.integrations.verl.RewardqAgentLoopManager"
)


def hook_on_v1_note(config: object) -> str:
    """What masking through the hook costs on the V1 trainer (the hook runs in verl's reward-loop actors,
    outside the agent-loop worker that decides what is stored; :mod:`rewardq.integrations.verl.groups`)."""
    mode = str(config_at(config, "trainer.v1.trainer_mode") or "sync")
    cost = (
        f"verl's replay buffer in trainer.v1.trainer_mode={mode} evicts the whole group of a sample the hook "
        "leaves out and generates it again, healthy samples included"
        if mode != "sync"
        else "a group that failures leave with one scored sample trains it alone, on its raw score (verl's GRPO "
        "rule for a group of one)"
    )
    return (
        f"rewardq: on verl's V1 trainer through the reward-manager hook, {cost}. rewardq's agent-loop manager "
        f"leaves out the failed sample alone and drops lone survivors: {AGENT_LOOP_MANAGER}"
    )
