"""The rollout side: push outputs, read and wait for rewards. Never imports the consumers."""

from rewardq.producers.aio import AsyncRewardClient
from rewardq.producers.client import RewardClient
from rewardq.producers.core import ClientSettings

__all__ = ["AsyncRewardClient", "ClientSettings", "RewardClient"]
