"""Every exception rewardq raises on purpose, in one place.

Each carries a message that says what went wrong *and* what to do next, because the
people reading it are RL engineers in the middle of a training run.
"""

from __future__ import annotations


class RewardqError(Exception):
    """Base class of every error rewardq raises deliberately."""


class ConfigError(RewardqError):
    """A setting is missing or wrong. The message names the setting."""


class RecordError(RewardqError, ValueError):
    """A record failed to encode, decode or validate.

    Attributes:
        field: the offending field (``"prompt_ids"``, ``"index"``, ...) or ``"<record>"``.
        permanent: True when retrying can never succeed (bad input), so the entry is
            dead-lettered at once instead of after ``max_deliveries`` attempts.
    """

    def __init__(self, field: str, message: str, *, permanent: bool = True) -> None:
        self.field = field
        self.permanent = permanent
        super().__init__(f"{field}: {message}")


class ScoringError(RewardqError):
    """A reward manager or scoring function failed or returned something unusable."""


class UnknownDataSourceError(ScoringError):
    """No default scorer exists for a ``data_source``."""


class UnknownManagerError(ConfigError):
    """``--manager`` names no registered manager and is not ``module:Class``."""


class BackpressureTimeout(RewardqError, TimeoutError):
    """The stream backlog stayed above ``max_backlog`` for longer than the producer would wait."""


class RewardTimeout(RewardqError, TimeoutError):
    """``wait_rewards`` ran out of time. ``missing`` lists the keys still without a result."""

    def __init__(self, missing: list[str], timeout: float) -> None:
        self.missing = list(missing)
        shown = ", ".join(self.missing[:10]) + (" ..." if len(self.missing) > 10 else "")
        super().__init__(
            f"{len(self.missing)} key(s) still have no reward after {timeout:g}s: {shown}. "
            "Check that workers are running (`rewardq status`) and that every output of "
            "these trajectories, including the final one, was pushed."
        )
