"""Masking advantage estimators for verl's DataProto trainers: a failed sample contributes nothing.

``algorithm.adv_estimator=rewardq_grpo`` (or ``rewardq_<name>`` for any name in
:data:`~rewardq.integrations.verl.policy.MASKABLE`) is verl's own estimator ``<name>``, registered
with verl's ``register_adv_est`` by :func:`register`, which importing :mod:`rewardq.integrations.verl`
runs. The legacy and one-step-off trainers import it in the process that computes advantages
(``RewardLoopManager`` resolves the hook's class there, and the agent-loop manager class is loaded
there). verl's fully-async trainer computes advantages in a process that builds neither, so it needs
:func:`register` run at every Ray worker's start:
``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rewardq.integrations.verl.mask.register``
(the adapter and the hook refuse a fully-async config without it at the run's first trajectory,
:func:`~rewardq.integrations.verl.policy.masking_refusal`). verl's ``compute_advantage`` calls it with the batch's
own ``token_level_rewards``, ``response_mask``, ``index`` (the ``uid`` groups) and the algorithm
config. A sample whose reward failed carries the reward NaN (what the adapter and the hook give it
under ``verl_on_error=mask``); the estimator:

* leaves it out: verl's estimator runs on the scored samples only, so every healthy sample's
  advantage is what verl computes on the batch without the failed ones (its group's mean and
  standard deviation are those of its scored samples);
* leaves out, too, every sample of a group that a failure left with fewer than two scored samples
  (a group of one by design, ``rollout.n=1``, keeps verl's own rule);
* gives the left-out samples advantage 0 and sets their ``response_mask`` to 0 *in the batch*
  (verl hands the batch's own tensor), so none of their tokens enter the policy loss, its KL or
  entropy terms, or its token-mean denominator.

A failed sample's reward stays NaN in the batch (``token_level_scores``, ``token_level_rewards``,
and the rollout dump ``trainer.rollout_data_dir`` writes): it has none, and a 0.0 there would read
as a wrong answer. Nothing after the estimator trains on the rewards; verl's reward metrics are
taken over the scored samples (:mod:`rewardq.integrations.verl.metrics`, whose wrapper each call
makes sure of, and to which it counts the samples it left out).

A batch without failures goes to verl's estimator untouched: the advantages are bit-identical to
verl's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from rewardq.integrations.verl import metrics
from rewardq.integrations.verl.policy import MASKABLE, PREFIX

__all__ = ["kept_rows", "masking_estimator", "register"]

Estimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def kept_rows(scores: torch.Tensor, index: object) -> torch.Tensor:
    """Which rows keep their place: scored (finite reward), and in a group that a failure did not
    leave with fewer than two scored samples."""
    scored = torch.isfinite(scores)
    if index is None:
        return scored
    groups: dict[Any, list[int]] = {}
    for row, uid in enumerate(np.asarray(index, dtype=object).tolist()):
        groups.setdefault(uid, []).append(row)
    keep = scored.clone()
    for rows in groups.values():
        ok = int(scored[rows].sum())
        if ok < len(rows) and ok < 2:
            keep[rows] = False
    return keep


def _call_verl(
    name: str, fn: Estimator, rewards: torch.Tensor, mask: torch.Tensor, index: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator ``name`` called as verl's ``compute_advantage`` calls it."""
    if name == "grpo":  # compute_advantage's own branch: no config, the std flag from it
        config = kwargs.get("config")
        norm = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
        return fn(token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=norm)
    return fn(token_level_rewards=rewards, response_mask=mask, index=index, **kwargs)


def masking_estimator(name: str) -> Estimator:
    """``rewardq_<name>``: verl's estimator ``name`` over the scored samples only (module docstring)."""
    inner: Estimator = core_algos.get_adv_estimator_fn(name)

    def estimator(
        token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        metrics.install()  # the trainer's process: its step metrics come next (rewardq.integrations.verl.metrics)
        keep = kept_rows(token_level_rewards.sum(-1), index)
        metrics.note_masked(len(keep), int((~keep).sum()))
        if bool(keep.all()):
            return _call_verl(name, inner, token_level_rewards, response_mask, index, **kwargs)
        response_mask[~keep] = 0  # in the batch: the actor's loss reads this very tensor
        sub = {k: v[keep] if _per_row(v, keep) else v for k, v in kwargs.items()}
        sub_index = None if index is None else np.asarray(index, dtype=object)[keep.numpy()]
        adv, ret = _call_verl(name, inner, token_level_rewards[keep], response_mask[keep], sub_index, **sub)
        advantages = torch.zeros_like(token_level_rewards, dtype=adv.dtype)
        returns = torch.zeros_like(token_level_rewards, dtype=ret.dtype)
        advantages[keep], returns[keep] = adv, ret
        return advantages, returns

    estimator.__name__ = estimator.__qualname__ = f"{PREFIX}{name}"
    estimator.__doc__ = f"verl's {name} over the scored samples only (rewardq.integrations.verl.mask)."
    return estimator


def _per_row(value: object, keep: torch.Tensor) -> bool:
    """A tensor with one entry per sample (``reward_baselines``), cut with the samples."""
    return isinstance(value, torch.Tensor) and value.shape[:1] == keep.shape


def register() -> None:
    """Register ``rewardq_<name>`` for every maskable verl estimator (once per process); also Ray's
    ``worker_process_setup_hook`` for the fully-async trainer (module docstring)."""
    for name in MASKABLE:
        if f"{PREFIX}{name}" not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(f"{PREFIX}{name}")(masking_estimator(name))
