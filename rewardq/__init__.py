"""rewardq: durable, horizontally scaled reward scoring for RL post-training, on Redis Streams.

Producers push one record per rollout output; workers assemble each trajectory, score it
with a verl-compatible reward manager, and write a reward back for every output key.
Delivery is at-least-once; the write-back is idempotent.

The folders follow the pipeline::

    producers/  ->  queue/  ->  consumers/  ->  reward/
    push outputs    Redis:      the worker:      managers, scorers, judges,
    wait for        streams,    assemble,        and where scoring functions
    rewards         keys, Lua   score, commit    run (reward/execution/)

``ops/`` holds the commands (``cli.py`` is only the door), ``integrations/`` the verl and Ray
adapters, ``demo/`` the self-contained demo. Beside them: ``config.py`` (every setting, declared
once; ``settings/`` derives the flags, variables and file layer), ``errors.py``
and ``testing.py`` (helpers for testing a manager or a scoring function).

The public names below are imported lazily, so importing a submodule (a scorer in a
child process, say) does not pay for redis, numpy and msgpack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewardq._lazy import lazy_getattr

if TYPE_CHECKING:
    from rewardq.errors import (
        BackpressureTimeout,
        ConfigError,
        PutError,
        RecordError,
        RedisConnectionLost,
        RedisOutOfMemory,
        RedisTimeout,
        RewardqError,
        RewardTimeout,
        ScoringError,
        TrajectoryTooLarge,
        TransientError,
    )
    from rewardq.producers.aio import AsyncRewardClient
    from rewardq.producers.client import RewardClient
    from rewardq.producers.core import ClientSettings
    from rewardq.queue.results import RewardResult
    from rewardq.queue.states import DeadLetterKind, FailureKind, ResultStatus

__version__ = "0.2.0"

_EXPORTS = {
    "RewardClient": "rewardq.producers.client",
    "AsyncRewardClient": "rewardq.producers.aio",
    "ClientSettings": "rewardq.producers.core",
    "RewardResult": "rewardq.queue.results",
    "ResultStatus": "rewardq.queue.states",
    "DeadLetterKind": "rewardq.queue.states",
    "FailureKind": "rewardq.queue.states",
    "RewardqError": "rewardq.errors",
    "ConfigError": "rewardq.errors",
    "RecordError": "rewardq.errors",
    "ScoringError": "rewardq.errors",
    "BackpressureTimeout": "rewardq.errors",
    "RewardTimeout": "rewardq.errors",
    "PutError": "rewardq.errors",
    "RedisOutOfMemory": "rewardq.errors",
    "RedisTimeout": "rewardq.errors",
    "RedisConnectionLost": "rewardq.errors",
    "TrajectoryTooLarge": "rewardq.errors",
    "TransientError": "rewardq.errors",
}

__all__ = [
    "AsyncRewardClient",
    "BackpressureTimeout",
    "ClientSettings",
    "ConfigError",
    "DeadLetterKind",
    "FailureKind",
    "PutError",
    "RecordError",
    "RedisConnectionLost",
    "RedisOutOfMemory",
    "RedisTimeout",
    "RewardClient",
    "ResultStatus",
    "RewardResult",
    "RewardTimeout",
    "RewardqError",
    "ScoringError",
    "TrajectoryTooLarge",
    "TransientError",
    "__version__",
]


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return __all__
