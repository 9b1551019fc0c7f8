"""rewardq inside a verl run: verl's trainers score on the rewardq fleet instead of verl's reward loop.

Two ways in, both for verl 0.9.1 (docs/verl-integration.md has the table of trainers):

**The reward-manager hook** reaches every verl trainer (legacy, V1/TransferQueue, one-step-off,
fully-async), because each loads its reward manager through ``RewardLoopManager`` ->
``RewardLoopWorker`` -> ``load_reward_manager``::

    reward.reward_manager.name=rewardq \\
    +reward.rewardq.redis_url=redis://redis-host:6379/0 +reward.rewardq.namespace=my-run

(the name ``rewardq`` is registered by :mod:`rewardq.integrations.verl.plugin`, which verl loads as a
plugin; without plugins, ``reward.reward_manager.source=importlib
reward.reward_manager.module.path=pkg://rewardq.integrations.verl
reward.reward_manager.name=RewardqRewardManager`` names the same class).

:class:`RewardqRewardManager` is a verl ``RewardManagerBase``: verl's reward-loop actors call its
``run_single(data)``, which rebuilds every output's exact ids from verl's ``prompt_len`` /
``response_len`` (never from the padded mask, which cuts a final response shorter than an earlier
one), pushes the trajectory, and returns ``{"reward_score", "reward_extra_info"}``.

**The agent-loop manager** skips verl's reward-loop hop (a Ray round trip per trajectory) on the
trainers that honour ``agent_loop_manager_class`` (legacy, V1, one-step-off)::

    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=rewardq.integrations.verl.RewardqAgentLoopManager

* :class:`RewardqAgentLoopManager` makes verl start :class:`RewardqAgentLoopWorker` actors. When
  the run uses verl's V1 trainer (``trainer.use_v1``, verl's default, which stores rollouts in
  TransferQueue), its ``create`` hands over to :class:`RewardqAgentLoopManagerTQ`, so the same
  override works on both trainers.
* :class:`RewardqAgentLoopWorker` (and its TransferQueue twin :class:`RewardqAgentLoopWorkerTQ`)
  replace ``_compute_score(outputs, kwargs)``: the trajectory is pushed to Redis, a fleet of
  ``rewardq worker`` processes scores it, and the rewards land on the outputs exactly where
  verl's reward loop puts them (``outputs[-1].reward_score``,
  ``outputs[-1].extra_fields["reward_extra_info"]``, ``outputs[-1].metrics.compute_score``).
  verl's reward-loop workers are not called, whether they exist or not.

Both paths share :class:`~rewardq.integrations.verl.scoring.VerlScorer`: a sample whose
reward failed is left out of training (``verl_on_error=mask``, the default; ``zero`` and ``raise``
remain), how depending on the trainer (:mod:`rewardq.integrations.verl.policy`; on the DataProto
trainers with the one key ``algorithm.adv_estimator=rewardq_grpo``, :mod:`rewardq.integrations.verl.mask`,
whose estimators :mod:`~rewardq.integrations.verl.entrypoints` registers with verl on import). A
``config`` failure, the run's failure budget spent (counted in Redis for the whole run) and an
unreachable Redis stop the run, on the V1 trainer too (:mod:`rewardq.integrations.verl.stop`). The
step metrics gain rewardq's figures (:mod:`rewardq.integrations.verl.metrics`). Settings:
:mod:`rewardq.integrations.verl.settings`.

The package's face imports nothing: the classes verl loads by name live in
:mod:`~rewardq.integrations.verl.entrypoints`, which imports verl (and Ray) and registers the
estimators, and are imported from there on first access. So the parts that read verl's batches,
settings and groups (``batch``, ``settings``, ``budget``, ``groups``, ...) load without verl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewardq._lazy import lazy_getattr

if TYPE_CHECKING:
    from rewardq.integrations.verl.entrypoints import (
        RewardqAgentLoopManager,
        RewardqAgentLoopManagerTQ,
        RewardqAgentLoopWorker,
        RewardqAgentLoopWorkerTQ,
        RewardqRewardManager,
        RewardqScoring,
        check_at_start,
        uses_v1_trainer,
    )

#: The names verl's config and Ray's pickles reach as ``rewardq.integrations.verl.<name>``.
__all__ = [
    "RewardqAgentLoopManager",
    "RewardqAgentLoopManagerTQ",
    "RewardqAgentLoopWorker",
    "RewardqAgentLoopWorkerTQ",
    "RewardqRewardManager",
    "RewardqScoring",
    "check_at_start",
    "uses_v1_trainer",
]

_ENTRYPOINTS = "rewardq.integrations.verl.entrypoints"
_EXPORTS = dict.fromkeys(__all__, _ENTRYPOINTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
