"""rewardq's figures in verl's step metrics, beside verl's own reward metrics (``critic/score/*``).

verl's trainers log a step's reward metrics from ``compute_data_metrics(batch)`` (the legacy and
one-step-off trainers' ``ray_trainer``, the fully-async trainer's ``separation.ray_trainer``, the V1
trainer's ``trainer_base``) into the dict they hand their logger (console, wandb, ...). verl has no
hook for a reward backend to add to it, so :func:`install` wraps that one name in those modules, in
the trainer's process (where :mod:`rewardq.integrations.verl` is imported), adding:

* ``rewardq/masked_share``: the share of the step's samples left out of training
  (``verl_on_error=mask``), and ``rewardq/masked`` their number;
* ``rewardq/failures/<kind>``: the step's samples that got no reward, by failure kind (``transient``,
  ``timeout``, ``scorer``, ``input``, ``unknown``; a ``config`` failure stops the run).

Where from: on a DataProto trainer the batch itself (its ``reward_failure_kind`` column, and the
masking estimator's count of the samples it left out); on the V1 trainer, whose batch never holds a
masked session, the run's outcome totals in Redis (:mod:`rewardq.integrations.verl_budget`), taken
as the difference since the previous step. Nothing is added to a run that never met rewardq's
settings (no failure column, no estimator, no Redis settings).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from rewardq.integrations.verl_budget import LABELS, OK, current_run
from rewardq.integrations.verl_settings import VerlAdapterSettings

logger = logging.getLogger("rewardq.verl")

#: verl's modules that call ``compute_data_metrics`` for a training step.
TRAINER_MODULES = (
    "verl.trainer.ppo.ray_trainer",
    "verl.trainer.ppo.v1.trainer_base",
    "verl.experimental.separation.ray_trainer",
)
#: The batch column the adapter and the hook fill with each sample's failure kind (None when scored).
KIND_COLUMN = "reward_failure_kind"

_lock = threading.Lock()
_state: dict[str, Any] = {"settings": None, "last": None}


def use_settings(settings: VerlAdapterSettings) -> None:
    """Where the V1 trainer's figures come from: the Redis and namespace the adapters count in."""
    with _lock:
        _state["settings"] = settings


def install() -> None:
    """Wrap ``compute_data_metrics`` in verl's trainer modules once, those this process has imported:
    the trainer's process has its trainer's module by the time it loads rewardq's classes; the
    rollout and reward processes, which log nothing, import none of them for it."""
    for name in TRAINER_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        original = getattr(module, "compute_data_metrics", None)
        if original is None or getattr(original, "_rewardq", False):
            continue
        module.compute_data_metrics = _wrapped(original)  # type: ignore[attr-defined]


def _wrapped(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def compute_data_metrics(batch: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        metrics = original(batch, *args, **kwargs)
        try:
            metrics.update(step_metrics(batch))
        except Exception:  # a figure of ours must never fail verl's step
            logger.exception("rewardq: could not compute the step's rewardq metrics")
        return metrics

    compute_data_metrics._rewardq = True  # type: ignore[attr-defined]
    return compute_data_metrics


def step_metrics(batch: Any) -> dict[str, float]:
    """rewardq's figures for the step whose batch is ``batch`` (module docstring)."""
    from rewardq.integrations.verl_mask import take_step_counts

    samples = len(batch)
    kinds = batch.non_tensor_batch.get(KIND_COLUMN) if hasattr(batch, "non_tensor_batch") else None
    counts = take_step_counts()
    if kinds is not None or counts:
        failures = Counter(str(k) for k in ([] if kinds is None else kinds) if k is not None)
        masked = counts.get("masked", 0)
        total = counts.get("samples", samples) or samples
        return _figures(masked, total, failures)
    return _from_redis(samples)


def _figures(masked: int, samples: int, failures: Counter[str]) -> dict[str, float]:
    out = {"rewardq/masked": float(masked), "rewardq/masked_share": masked / samples if samples else 0.0}
    out.update({f"rewardq/failures/{k}": float(failures.get(k, 0)) for k in LABELS if k != OK})
    return out


def _from_redis(samples: int) -> dict[str, float]:
    """The V1 figures: the run's outcome totals in Redis since the previous step."""
    settings = _state["settings"]
    if settings is None:
        return {}
    from rewardq.queue.connection import connect_sync
    from rewardq.queue.keys import Keyspace

    client = connect_sync(settings.redis_url, cluster=settings.cluster)
    try:
        key = Keyspace(settings.namespace).verl_budget(current_run())
        values = client.hmget(key, [f"t:{label}" for label in LABELS])
    finally:
        client.close()
    totals = {label: int(v or 0) for label, v in zip(LABELS, values)}
    with _lock:
        last = _state["last"] or dict.fromkeys(LABELS, 0)
        _state["last"] = totals
    step = {label: max(0, totals[label] - last.get(label, 0)) for label in LABELS}
    failures = Counter({k: n for k, n in step.items() if k != OK})
    masked = sum(failures.values())
    return _figures(masked, masked + samples, failures)
