"""The verl adapter's failure budget and its settings (no verl needed)."""

from __future__ import annotations

import pytest

from rewardq import defaults
from rewardq.errors import ConfigError, ScoringError
from rewardq.integrations.verl_budget import ErrorBudget, error_reason
from rewardq.integrations.verl_settings import settings_for, where

UNKNOWN = "scoring failed: UnknownDataSourceError: no default scorer for data_source 'x'"


def test_it_never_raises_before_the_window_has_filled() -> None:
    budget = ErrorBudget(0.5, 8)
    for _ in range(7):
        budget.record(UNKNOWN)  # 7 of 7 failed, but the window is not full
    with pytest.raises(ScoringError, match="8 of the last 8"):
        budget.record(UNKNOWN)


def test_the_message_counts_errors_by_reason_and_names_the_settings() -> None:
    budget = ErrorBudget(0.25, 4, settings_hint="REWARDQ_VERL_MAX_ERROR_RATE")
    budget.record(None)
    budget.record("rewardq: the trajectory timed out: 1 key(s) still have no reward after 900s")
    budget.record(UNKNOWN)
    with pytest.raises(ScoringError) as info:
        budget.record(UNKNOWN)
    text = str(info.value)
    assert "3 of the last 4" in text and "verl_max_error_rate=0.25" in text and "REWARDQ_VERL_MAX_ERROR_RATE" in text
    assert "2 scoring failed (UnknownDataSourceError), 1 timed out" in text
    assert text.endswith(UNKNOWN)  # the last error, whole


def test_exactly_the_allowed_share_goes_on_and_the_window_slides() -> None:
    budget = ErrorBudget(0.5, 4)
    for outcome in [UNKNOWN, None, UNKNOWN, None] * 5:  # 2 of every 4: not more than half
        budget.record(outcome)
    assert budget.errors == 2
    budget.record(UNKNOWN)  # the window slides: still 2 of the last 4
    with pytest.raises(ScoringError):
        budget.record(UNKNOWN)  # 3 of the last 4


def test_a_rate_of_one_never_raises() -> None:
    budget = ErrorBudget(1.0, 2)
    for _ in range(50):
        budget.record(UNKNOWN)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (UNKNOWN, "scoring failed (UnknownDataSourceError)"),
        ("rewardq: the trajectory timed out: 2 key(s) still have no reward", "timed out"),
        ("rewardq: the trajectory could not be sent: sample: bad", "could not be sent"),
        ("tokenizer: wrong tokenizer: the ids were made with ...", "wrong tokenizer"),
        ("invalid record: prompt_ids: token id 9 is negative", "invalid record"),
        ("", "error"),
    ],
)
def test_error_reasons(message: str, reason: str) -> None:
    assert error_reason(message) == reason


def test_budget_settings_defaults_environment_and_config() -> None:
    s = settings_for(None, {})
    assert (s.max_error_rate, s.error_window) == (defaults.VERL_MAX_ERROR_RATE, defaults.VERL_ERROR_WINDOW)
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
