"""The reward side: manager base class, registry, built-in managers and default scorers."""

from rewardq.reward.base import ManagerContext, RewardManager, normalize_result
from rewardq.reward.registry import get_manager_class, known_managers, register

__all__ = ["ManagerContext", "RewardManager", "get_manager_class", "known_managers", "normalize_result", "register"]
