"""rewardq: durable, horizontally scaled reward scoring for RL post-training, on Redis Streams.

Producers push one record per rollout output; workers assemble each trajectory, score it
with a verl-compatible reward manager, and write a reward back for every output key.
Delivery is at-least-once; the write-back is idempotent.
"""

from rewardq.errors import (BackpressureTimeout, ConfigError, RecordError, RewardqError, RewardTimeout,
                            ScoringError)
from rewardq.producers import AsyncRewardClient, ClientSettings, RewardClient
from rewardq.queue.results import RewardResult

__version__ = "0.1.0"

__all__ = [
    "AsyncRewardClient", "BackpressureTimeout", "ClientSettings", "ConfigError", "RecordError",
    "RewardClient", "RewardResult", "RewardTimeout", "RewardqError", "ScoringError", "__version__",
]
