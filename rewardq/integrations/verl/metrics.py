"""rewardq's figures in verl's step metrics, and verl's reward metrics over the scored samples only.

verl's trainers log a step's reward metrics from ``compute_data_metrics(batch)`` (the legacy and
one-step-off trainers' ``ray_trainer``, the fully-async trainer's ``separation.ray_trainer``, the V1
trainer's ``trainer_base``) into the dict they hand their logger (console, wandb, ...), and the
DataProto trainers' validation reduces its samples with ``process_validation_metrics``
(``ray_trainer``, also run by the fully-async rollouter). verl has no hook for a reward backend to
add to either, so :func:`install` wraps those names in the modules this process has imported
(once: a wrapped function is marked and never wrapped again). It runs when
:mod:`rewardq.integrations.verl` is imported, when the agent-loop manager is built, and at every
call of a masking estimator, which verl runs in the trainer's process just before it computes the
step's metrics: so the wrapper is in place whichever way rewardq entered that process.

Step metrics added:

* ``rewardq/masked_share``: the share of the step's samples left out of training
  (``verl_on_error=mask``: failed, or left alone in their group), and ``rewardq/masked`` their number;
* ``rewardq/failures/<kind>``: the step's samples that got no reward, by failure kind (``transient``,
  ``timeout``, ``scorer``, ``input``, ``unknown``; a ``config`` failure stops the run).

verl's own ``critic/score/*`` and ``critic/rewards/*`` are taken over the samples that got a reward
(a failed sample's reward is NaN on a DataProto trainer: "no reward", never 0.0), so a judge outage
does not read as a drop in the policy's score; the validation metrics leave such samples out too,
with a warning naming how many.

Where the figures come from: on a DataProto trainer, the batch itself (its ``reward_failure_kind``
column, and the masking estimator's count of the samples it left out); on the V1 trainer, whose batch
never holds a masked session, the run's totals in Redis (:mod:`rewardq.queue.failure_budget`), as
the difference since the previous step's metrics (so trajectories scored for validation meanwhile
count in the next step's figures). Nothing is added to a run that never met rewardq's settings.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

import numpy as np

from rewardq.adapter_settings import AdapterSettings
from rewardq.integrations.verl.budget import LABELS, OK, current_run
from rewardq.integrations.verl.settings import config_at, settings_for

logger = logging.getLogger("rewardq.verl")

#: verl's modules that call ``compute_data_metrics`` for a training step.
TRAINER_MODULES = (
    "verl.trainer.ppo.ray_trainer",
    "verl.trainer.ppo.v1.trainer_base",
    "verl.experimental.separation.ray_trainer",
)
#: verl's module whose ``_validate`` (the DataProto trainers', the fully-async rollouter's) calls
#: ``process_validation_metrics``; the V1 trainer's validation never holds a failed session.
VALIDATION_MODULES = ("verl.trainer.ppo.ray_trainer",)
#: The batch column the adapter and the hook fill with each sample's failure kind (None when scored).
KIND_COLUMN = "reward_failure_kind"
#: verl's reward metrics that are recomputed over the samples that got a reward.
REWARD_FIGURES = ("critic/score/", "critic/rewards/")
#: How many frames up :func:`_trainer_settings` looks for the trainer calling ``compute_data_metrics``.
CALLER_DEPTH = 6

_lock = threading.Lock()
_state: dict[str, Any] = {"settings": None, "last": None}
_counts: dict[str, int] = {}  # the masking estimators' {"samples", "masked"} since the last step's metrics


def use_settings(settings: AdapterSettings) -> None:
    """Where the V1 trainer's figures come from: the Redis and namespace the adapters count in."""
    with _lock:
        _state["settings"] = settings


def note_masked(samples: int, masked: int) -> None:
    """A masking estimator's count for one batch: ``samples`` seen, ``masked`` left out."""
    with _lock:
        _counts["samples"] = _counts.get("samples", 0) + samples
        _counts["masked"] = _counts.get("masked", 0) + masked


def take_step_counts() -> dict[str, int]:
    """The samples and masked samples the masking estimators saw since the last call (this process)."""
    with _lock:
        out = dict(_counts)
        _counts.clear()
    return out


def install() -> None:
    """Wrap ``compute_data_metrics`` and ``process_validation_metrics`` in verl's trainer modules this
    process has imported, each once (module docstring)."""
    with _lock:
        for name in TRAINER_MODULES:
            _wrap(name, "compute_data_metrics", _with_rewardq_figures)
        for name in VALIDATION_MODULES:
            _wrap(name, "process_validation_metrics", _over_scored_samples)


def _wrap(module_name: str, attr: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    module = sys.modules.get(module_name)
    original = getattr(module, attr, None) if module is not None else None
    if original is None or getattr(original, "_rewardq", False):
        return
    wrapped = functools.wraps(original)(wrapper(original))
    wrapped._rewardq = True  # type: ignore[attr-defined]
    setattr(module, attr, wrapped)


def _with_rewardq_figures(original: Callable[..., dict[str, object]]) -> Callable[..., dict[str, object]]:
    def compute_data_metrics(batch: object, *args: object, **kwargs: object) -> dict[str, object]:
        metrics = original(batch, *args, **kwargs)
        try:
            metrics.update(reward_figures(original, batch, metrics, *args, **kwargs))
            metrics.update(step_metrics(batch))
        except Exception:  # a figure of ours must never fail verl's step
            logger.exception("rewardq: could not compute the step's rewardq metrics")
        return metrics

    return compute_data_metrics


def unscored_rows(batch: object) -> np.ndarray[Any, np.dtype[np.bool_]] | None:
    """Which rows of a DataProto batch have no reward (NaN: ``verl_on_error=mask``), or None when the
    batch has no scores. A ``zero`` row keeps its 0.0 in verl's figures: that is what it trains on."""
    tensors = getattr(batch, "batch", None)
    if tensors is None or "token_level_scores" not in tensors.keys():
        return None
    rewards: np.ndarray[Any, np.dtype[np.float32]] = tensors["token_level_scores"].sum(-1).cpu().numpy()
    unscored: np.ndarray[Any, np.dtype[np.bool_]] = ~np.isfinite(rewards)
    return unscored


def reward_figures(
    original: Callable[..., Mapping[str, object]], batch: Any, metrics: Mapping[str, object], *args: Any, **kwargs: Any
) -> dict[str, object]:
    """verl's ``critic/score/*`` and ``critic/rewards/*`` (``metrics``, verl's figures for the whole
    ``batch``) over the rows that got a reward, by verl's own computation on them; NaN when none
    did, as verl says "no sample"; nothing to change when every row did."""
    unscored = unscored_rows(batch)
    if unscored is None or not unscored.any():
        return {}
    if unscored.all():
        return {k: math.nan for k in metrics if k.startswith(REWARD_FIGURES)}
    scored = original(batch.select_idxs(~unscored), *args, **kwargs)
    return {k: v for k, v in scored.items() if k.startswith(REWARD_FIGURES)}


def step_metrics(batch: Any) -> dict[str, float]:
    """rewardq's figures for the step whose batch is ``batch`` (module docstring): from the batch when
    it has the failure-kind column (a DataProto trainer's), else from the run's totals in Redis."""
    counts = take_step_counts()
    non_tensor = getattr(batch, "non_tensor_batch", None) or {}
    kinds = non_tensor.get(KIND_COLUMN)
    if kinds is None:
        return _from_redis()
    failures = Counter(str(k) for k in kinds if k is not None)
    return _figures(counts.get("masked", 0), counts.get("samples") or len(batch), failures)


def _figures(masked: int, samples: int, failures: Counter[str]) -> dict[str, float]:
    out = {"rewardq/masked": float(masked), "rewardq/masked_share": masked / samples if samples else 0.0}
    out.update({f"rewardq/failures/{k}": float(failures.get(k, 0)) for k in LABELS if k != OK})
    return out


def _from_redis() -> dict[str, float]:
    """The V1 figures: the run's totals in Redis since the previous step, in trajectories."""
    from rewardq.queue.connection import connect_sync
    from rewardq.queue.failure_budget import DROPPED, run_totals
    from rewardq.queue.keys import Keyspace

    settings = _trainer_settings() or _state["settings"]
    if settings is None:
        return {}
    key = Keyspace(settings.namespace).verl_budget(current_run())
    client = connect_sync(settings.redis_url, cluster=settings.cluster)
    try:
        totals = run_totals(client, key, (*LABELS, DROPPED))
    finally:
        client.close()
    with _lock:
        last = _state["last"].get(key) if _state["last"] else None
        if last is None or any(totals[k] < last.get(k, 0) for k in totals):  # first step, or the hash began anew
            last = dict.fromkeys(totals, 0)
        _state["last"] = {key: totals}
    step = {label: totals[label] - last.get(label, 0) for label in totals}
    failures = Counter({k: step[k] for k in LABELS if k != OK})
    failed = sum(failures.values())
    return _figures(failed + step[DROPPED], failed + step[OK], failures)


def _trainer_settings() -> AdapterSettings | None:
    """rewardq's settings from the config of the verl trainer calling ``compute_data_metrics`` (the
    ``self.config`` of the trainer method that asked for the step's metrics), or None.

    With the hook alone rewardq's classes are built in other processes, so nothing hands the
    trainer's process its settings (the agent-loop manager does, :func:`use_settings`, read when this
    finds no trainer); verl gives a reward backend no other way to them here.
    """
    frame: FrameType | None = sys._getframe(1)
    for _ in range(CALLER_DEPTH):
        if frame is None:
            break
        config = getattr(frame.f_locals.get("self"), "config", None)
        if config_at(config, "reward") is not None:
            return settings_for(config)
        frame = frame.f_back
    return None


def _over_scored_samples(original: Callable[..., object]) -> Callable[..., object]:
    def process_validation_metrics(
        data_sources: Sequence[object],
        sample_uids: Sequence[object],
        infos_dict: dict[str, list[object]],
        *args: object,
        **kw: object,
    ) -> object:
        keep = _scored_validation_samples(infos_dict.get("reward"))
        if keep is None:
            return original(data_sources, sample_uids, infos_dict, *args, **kw)
        logger.warning(
            "rewardq: %d of %d validation samples got no reward (verl_on_error=mask) and are left out of the "
            "validation metrics; `rewardq status` says why",
            len(keep) - int(keep.sum()),
            len(keep),
        )
        rows = np.flatnonzero(keep)
        sources = np.asarray(data_sources, dtype=object)[rows]
        uids = [sample_uids[int(i)] for i in rows]
        infos = {k: [v[int(i)] for i in rows] if len(v) == len(keep) else v for k, v in infos_dict.items()}
        return original(sources, uids, infos, *args, **kw)

    return process_validation_metrics


def _scored_validation_samples(rewards: Sequence[object] | None) -> np.ndarray[Any, np.dtype[np.bool_]] | None:
    """Which validation samples got a reward, or None when all did (or the infos hold no rewards)."""
    if not rewards:
        return None
    keep = np.isfinite(np.asarray(rewards, dtype=float))
    return None if keep.all() else keep
