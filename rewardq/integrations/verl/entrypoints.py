"""The classes verl loads by name (reached as ``rewardq.integrations.verl.<name>``, see the package).

Importing this module imports verl and Ray and registers rewardq's masking estimators with verl
(:mod:`~rewardq.integrations.verl.mask`) and its step metrics
(:mod:`~rewardq.integrations.verl.metrics`). The TransferQueue classes import verl's V1 trainer,
which needs the ``transfer_queue`` package, so they are built on first access.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import ray
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from rewardq.errors import ConfigError
from rewardq.integrations.verl import mask, metrics
from rewardq.integrations.verl.batch import dataset_row, trajectory_outputs
from rewardq.integrations.verl.fleet import ensure_fleet_once
from rewardq.integrations.verl.policy import V1, masking_refusal, trainer_kind
from rewardq.integrations.verl.scoring import (
    ERROR_EXTRA_INFO,
    SKIPPED_COLUMNS,
    VerlScorer,
    align_reward_extra_info,
    empty_like,
    settings_for,
    trajectory_names,
)
from rewardq.integrations.verl.tq import TransferQueueSessions

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rewardq.reward.tokenizer import Tokenizer

# RewardqAgentLoopManagerTQ and RewardqAgentLoopWorkerTQ are built on first access (module __getattr__)
__all__ = ["RewardqAgentLoopManager", "RewardqAgentLoopWorker", "RewardqRewardManager", "RewardqScoring"]


class RewardqScoring:
    """The rewardq ``_compute_score``, shared by the plain and the TransferQueue agent-loop workers.

    Works on an instance whose verl ``__init__`` never ran (``object.__new__``): without
    ``self.config`` the settings come from the ``REWARDQ_*`` environment alone, and without
    ``self.tokenizer`` (verl's policy tokenizer) no tokenizer fingerprint is sent.
    """

    def rewardq_scorer(self) -> VerlScorer:
        scorer = self.__dict__.get("_rewardq_scorer")
        if scorer is None:
            config = self.__dict__.get("config")
            scorer = VerlScorer(settings_for(config), self.__dict__.get("tokenizer"), config)
            self.__dict__["_rewardq_scorer"] = scorer
        return scorer

    async def _compute_score(self, outputs: list[object], kwargs: dict[str, object]) -> None:
        """Score the trajectory ``outputs`` (one sample of ``kwargs``'s dataset row) on the rewardq fleet
        (started first on the trainer's Ray cluster when the config has ``reward.rewardq.fleet.workers``)."""
        await ensure_fleet_once(self.__dict__.get("config"))
        await self.rewardq_scorer().score(outputs, kwargs)


class RewardqAgentLoopWorker(RewardqScoring, AgentLoopWorker):
    """verl's ``AgentLoopWorker``, scoring on the rewardq fleet (see the module docstring)."""

    def _postprocess(
        self, inputs: list[Any], input_non_tensor_batch: dict[str, Any] | None = None, validate: bool = False
    ) -> object:
        """verl's batch assembly, after giving every row's ``reward_extra_info`` the same keys.

        verl takes the keys of row 0 and indexes every row with them; an error result (only
        ``acc``) beside a DAPO result (``score``, ``acc``, ``pred``) would raise KeyError there.
        """
        align_reward_extra_info([i.extra_fields for i in inputs], [i.reward_score for i in inputs])
        return super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch, validate=validate)


class RewardqAgentLoopManager(AgentLoopManager):
    """verl's ``AgentLoopManager`` with :class:`RewardqAgentLoopWorker` actors.

    On verl's V1 trainer (``trainer.use_v1: true``, whose task runner turns ``transfer_queue.enable``
    on) :meth:`create` returns a :class:`RewardqAgentLoopManagerTQ` instead, which is what that
    trainer needs.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.agent_loop_workers_class = ray.remote(RewardqAgentLoopWorker)
        check_at_start(kwargs.get("config", args[0] if args else None))
        super().__init__(*args, **kwargs)

    @classmethod
    def create(cls, *args: object, **kwargs: object) -> Any:
        config = kwargs.get("config", args[0] if args else None)
        if cls is RewardqAgentLoopManager and uses_v1_trainer(config):
            return _tq_classes()["RewardqAgentLoopManagerTQ"].create(*args, **kwargs)
        return super().create(*args, **kwargs)


class RewardqRewardManager(RewardManagerBase):
    """verl's reward manager API in front of the rewardq fleet: the hook every verl trainer loads.

    verl constructs it as ``cls(config, tokenizer, compute_score, reward_router_address=...,
    reward_model_tokenizer=...)`` in each reward-loop actor; ``tokenizer`` is the policy's, whose
    fingerprint goes with every record. ``compute_score`` is verl's (the workers score with their
    own, from the same config file), so it is not called here.

    ``run_single(data)`` takes one trajectory as verl's reward loop batches it (see
    :mod:`rewardq.integrations.verl.batch`) and returns ``{"reward_score", "reward_extra_info"}``.
    ``reward_extra_info`` is the final output's result plus ``reward_error`` (None when scored):
    verl builds its batch columns from row 0's keys and looks each up in every row, so every row
    carries the same keys. An error row gets ``reward_score`` 0.0 and the keys of the last scored
    result of its data source seen by this actor (each empty of its type, ``score`` 0.0), else
    ``{"acc": 0.0}``.
    """

    def __init__(
        self,
        config: object,
        tokenizer: Tokenizer,
        compute_score: object = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: object = None,
        **kwargs: object,
    ) -> None:
        super().__init__(config, tokenizer, compute_score)
        self.rewardq_config = config  # reward.rewardq.fleet in it starts the Ray fleet on first use
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer
        self.scorer = VerlScorer(settings_for(config), tokenizer, config, hook=True)
        self._keys_by_source: dict[Any, dict[str, Any]] = {}

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        """Score the trajectory in ``data`` on the rewardq fleet; verl's reward-manager return value."""
        await ensure_fleet_once(self.rewardq_config)
        sample = dataset_row(data, SKIPPED_COLUMNS)
        uid, session_id = trajectory_names(sample)
        result, failure, reward = await self.scorer.score_trajectory(uid, session_id, trajectory_outputs(data), sample)
        source = str(sample.get("data_source"))
        if result is not None and result.reward_score is not None:
            info = {**result.reward_extra_info, "reward_error": None, "reward_failure_kind": None}
            self._keys_by_source[source] = self._keys_by_source[None] = info
            return {"reward_score": float(result.reward_score), "reward_extra_info": info}
        example = self._keys_by_source.get(source) or self._keys_by_source.get(None) or ERROR_EXTRA_INFO
        info = {k: 0.0 if k == "score" else empty_like(v) for k, v in example.items()}
        assert failure is not None  # no result: the scorer said why
        info.update(ERROR_EXTRA_INFO, reward_error=failure.message, reward_failure_kind=failure.kind)
        return {"reward_score": reward, "reward_extra_info": info}


def uses_v1_trainer(config: object) -> bool:
    """Whether ``config`` is that of verl's V1 (TransferQueue) trainer (see ``policy.trainer_kind``)."""
    return trainer_kind(config) == V1


def check_at_start(config: object) -> None:
    """In the trainer's process, as the agent-loop manager is built: refuse a configuration that
    cannot mask, and let the step metrics read the run's figures.

    Raises:
        ConfigError: ``verl_on_error=mask`` with an estimator that would train on the failed samples.
    """
    if config is None:
        return
    settings = settings_for(config)
    refusal = masking_refusal(settings, config)
    if refusal is not None:
        raise ConfigError(refusal)
    metrics.use_settings(settings)
    metrics.install()  # the trainer's module is imported by now, whenever rewardq's was


mask.register()  # algorithm.adv_estimator=rewardq_grpo, ... in the trainer's process (module docstring)
metrics.install()


@functools.cache
def _tq_classes() -> dict[str, Any]:
    """Build the TransferQueue variants once (verl's V1 trainer imports ``transfer_queue``)."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

    base: Any = AgentLoopWorkerTQ.__ray_metadata__.modified_class  # the class under verl's @ray.remote

    class RewardqAgentLoopWorkerTQ(TransferQueueSessions, RewardqScoring, base):
        """verl's ``AgentLoopWorkerTQ``, scoring on the rewardq fleet
        (:class:`~rewardq.integrations.verl.tq.TransferQueueSessions` says what it adds)."""

    class RewardqAgentLoopManagerTQ(AgentLoopManagerTQ):
        """verl's ``AgentLoopManagerTQ`` with :class:`RewardqAgentLoopWorkerTQ` actors (it picks its
        worker class inside its own ``__init__``, so the choice is made after it)."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            check_at_start(kwargs.get("config", args[0] if args else None))
            super().__init__(*args, **kwargs)
            self.agent_loop_workers_class = ray.remote(RewardqAgentLoopWorkerTQ)

    classes = (RewardqAgentLoopWorkerTQ, RewardqAgentLoopManagerTQ)
    for cls in classes:
        # importable by name (module __getattr__ below), so Ray ships them by reference
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return {cls.__name__: cls for cls in classes}


def __getattr__(name: str) -> object:
    if name in ("RewardqAgentLoopWorkerTQ", "RewardqAgentLoopManagerTQ"):
        return _tq_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
