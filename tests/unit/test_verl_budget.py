"""The verl adapter's failure-budget settings (no verl needed); the budget itself is tests/verl/test_safety.py's,
on real Redis."""

from __future__ import annotations

import pytest

from rewardq.errors import ConfigError
from rewardq.integrations.verl.settings import settings_for, where


def test_budget_settings_defaults_environment_and_config() -> None:
    s = settings_for(None, {})
    assert (s.max_error_rate, s.error_window) == (0.2, 256)
    assert "REWARDQ_REDIS_URL or reward.rewardq.redis_url" in where(s, "redis_url")
    env = {"REWARDQ_VERL_MAX_ERROR_RATE": "0.5", "REWARDQ_VERL_ERROR_WINDOW": "8"}
    s = settings_for({"reward": {"rewardq": {"verl_error_window": 64, "redis_url": "redis://h:1/0"}}}, env)
    assert (s.max_error_rate, s.error_window) == (0.5, 8)  # the environment wins
    assert (
        where(s, "error_window") == "REWARDQ_VERL_ERROR_WINDOW" and where(s, "redis_url") == "reward.rewardq.redis_url"
    )
    s = settings_for({"rewardq": {"verl_max_error_rate": 0.1}}, {})
    assert s.max_error_rate == 0.1 and where(s, "max_error_rate") == "rewardq.verl_max_error_rate"


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("verl_max_error_rate", 1.5, "1.5"),
        ("verl_max_error_rate", "lots", "lots"),
        ("verl_max_error_rate", True, "bool"),
        ("verl_error_window", 0, "0"),
        ("verl_error_window", "eight", "eight"),
        ("verl_error_window", True, "bool"),
    ],
)
def test_bad_budget_settings_name_the_setting(key: str, value: float | str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        settings_for({"reward": {"rewardq": {key: value}}}, {})
    assert key in str(info.value)
