"""rewardq: durable, horizontally scaled reward scoring for RL post-training, on Redis Streams.

Producers push one record per rollout output; workers assemble each trajectory, score it
with a verl-compatible reward manager, and write a reward back for every output key.
Delivery is at-least-once; the write-back is idempotent.

The public names below are imported lazily, so importing a submodule (a scorer in a
child process, say) does not pay for redis, numpy and msgpack.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "RewardClient": "rewardq.producers.client",
    "AsyncRewardClient": "rewardq.producers.aio",
    "ClientSettings": "rewardq.producers.core",
    "RewardResult": "rewardq.queue.results",
    "RewardqError": "rewardq.errors",
    "ConfigError": "rewardq.errors",
    "RecordError": "rewardq.errors",
    "ScoringError": "rewardq.errors",
    "BackpressureTimeout": "rewardq.errors",
    "RewardTimeout": "rewardq.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rewardq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
