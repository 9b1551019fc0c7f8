"""The settings of rewardq's verl adapter and reward-loop hook; no verl import here.

Lowest precedence first: defaults, the verl config's ``rewardq`` or ``reward.rewardq`` block, then
the environment:

===============================  ==========================  ======================================
variable                         config key                  meaning
===============================  ==========================  ======================================
``REWARDQ_REDIS_URL``            ``redis_url``               where the workers are (rediss://, cluster)
``REWARDQ_NAMESPACE``            ``namespace``               the workers' namespace
``REWARDQ_CLUSTER``              ``cluster``                 the URL is a Redis Cluster
``REWARDQ_VERL_TIMEOUT``         ``verl_timeout``            seconds to wait for one trajectory's rewards
``REWARDQ_VERL_ON_ERROR``        ``verl_on_error``           ``zero`` (default) or ``raise``
``REWARDQ_VERL_MAX_ERROR_RATE``  ``verl_max_error_rate``     failure budget: largest share of errors ...
``REWARDQ_VERL_ERROR_WINDOW``    ``verl_error_window``       ... among this many last trajectories
===============================  ==========================  ======================================

Each setting remembers where its value came from (:attr:`VerlAdapterSettings.sources`), so an error
names the setting to change (``REWARDQ_REDIS_URL``, or ``reward.rewardq.redis_url``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rewardq import defaults
from rewardq.config import parse_bool
from rewardq.errors import ConfigError

ON_ERROR_CHOICES = ("zero", "raise")
#: attribute -> (config key, environment variable), in the order of the module table.
SETTINGS: dict[str, tuple[str, str]] = {
    "redis_url": ("redis_url", "REWARDQ_REDIS_URL"),
    "namespace": ("namespace", "REWARDQ_NAMESPACE"),
    "cluster": ("cluster", "REWARDQ_CLUSTER"),
    "timeout": ("verl_timeout", "REWARDQ_VERL_TIMEOUT"),
    "on_error": ("verl_on_error", "REWARDQ_VERL_ON_ERROR"),
    "max_error_rate": ("verl_max_error_rate", "REWARDQ_VERL_MAX_ERROR_RATE"),
    "error_window": ("verl_error_window", "REWARDQ_VERL_ERROR_WINDOW"),
}
#: The verl config blocks the settings are read from (the later one wins).
BLOCKS = ("rewardq", "reward.rewardq")


@dataclass
class VerlAdapterSettings:
    """Where the adapter finds the workers and how it treats failures (see the module table)."""

    redis_url: str = defaults.REDIS_URL
    namespace: str = defaults.NAMESPACE
    cluster: bool = False
    timeout: float = defaults.VERL_TIMEOUT
    on_error: str = "zero"
    max_error_rate: float = defaults.VERL_MAX_ERROR_RATE
    error_window: int = defaults.VERL_ERROR_WINDOW
    #: attribute -> where its value came from (``"REWARDQ_REDIS_URL"``, ``"reward.rewardq.redis_url"``)
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_sources(
        cls, block: Mapping[str, Any] | None, env: Mapping[str, str], block_name: str = "rewardq config"
    ) -> VerlAdapterSettings:
        """Defaults < ``block`` (the verl config's ``rewardq`` settings) < ``env``."""
        s = cls()
        block = block or {}
        for attr, (key, var) in SETTINGS.items():
            if block.get(key) is not None:
                setattr(s, attr, _typed(attr, f"{block_name}.{key}", block[key]))
                s.sources[attr] = f"{block_name}.{key}"
            if env.get(var) not in (None, ""):
                setattr(s, attr, _typed(attr, var, env[var]))
                s.sources[attr] = var
        return s

    def where(self, attr: str) -> str:
        """The setting that sets ``attr``: where it came from, or how to set it when it is the default."""
        if attr in self.sources:
            return self.sources[attr]
        key, var = SETTINGS[attr]
        return f"the default; set {var} or reward.rewardq.{key}"


def _typed(attr: str, where: str, value: Any) -> Any:  # noqa: C901 - one branch per setting type
    if attr == "cluster":
        flag = value if isinstance(value, bool) else parse_bool(str(value))
        if flag is None:
            raise ConfigError(f"{where}={value!r} must be true or false")
        return flag
    if attr in ("timeout", "max_error_rate"):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}={value!r} must be a number") from None
        if isinstance(value, bool):
            raise ConfigError(f"{where}={value!r} must be a number")
        if attr == "timeout" and not number > 0:
            raise ConfigError(f"{where}={value!r} must be a number of seconds > 0")
        if attr == "max_error_rate" and not 0 <= number <= 1:
            raise ConfigError(
                f"{where}={value!r} must be a share of trajectories from 0 to 1 (0.2: more than 20 % errors "
                "among the last verl_error_window trajectories stops the run; 1 never stops it)"
            )
        return number
    if attr == "error_window":
        try:
            window = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            window = 0
        if isinstance(value, bool) or window < 1:
            raise ConfigError(f"{where}={value!r} must be a whole number of trajectories >= 1")
        return window
    if attr == "on_error":
        text = str(value).strip().lower()
        if text not in ON_ERROR_CHOICES:
            raise ConfigError(
                f"{where}={value!r} must be 'zero' (an error scores 0.0, the message goes to "
                "extra_fields['reward_error']) or 'raise' (the error fails the rollout)"
            )
        return text
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}={value!r} must be a non-empty string")
    return value


def settings_for(config: Any, env: Mapping[str, str] | None = None) -> VerlAdapterSettings:
    """The adapter's settings for a verl config (an OmegaConf ``DictConfig``, a dict or None)."""
    block: dict[str, Any] = {}
    names: dict[str, str] = {}
    for path in BLOCKS:
        found = config_at(config, path)
        if found is not None:
            if not isinstance(found, Mapping):
                raise ConfigError(f"the verl config's {path} must be a mapping of rewardq settings, got {found!r:.80}")
            block.update(found)
            names.update(dict.fromkeys(found, path))
    settings = VerlAdapterSettings.from_sources(block, os.environ if env is None else env)
    for attr, where in list(settings.sources.items()):  # name the block each file value came from
        key = SETTINGS[attr][0]
        if where.startswith("rewardq config.") and key in names:
            settings.sources[attr] = f"{names[key]}.{key}"
    return settings


def config_at(config: Any, path: str) -> Any:
    """``config[a][b]`` for ``path`` ``a.b`` over dicts or OmegaConf configs (a container comes back
    as a plain, resolved dict); None when absent."""
    node = config
    for part in path.split("."):
        if node is None:
            return None
        try:
            node = node.get(part) if hasattr(node, "get") else None
        except Exception:  # noqa: BLE001 - an OmegaConf node that cannot resolve is "not set" here
            return None
    if node is not None and hasattr(node, "_get_node"):  # an OmegaConf container: plain dict, resolved
        from omegaconf import OmegaConf

        node = OmegaConf.to_container(node, resolve=True)
    return node
