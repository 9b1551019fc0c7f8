"""Where the verl adapter and hook read their settings from; no verl import here.

The settings are declared once, beside the worker's, as :class:`rewardq.adapter_settings.AdapterSettings`.
Lowest precedence first: defaults, the verl config's ``rewardq`` then ``reward.rewardq`` block,
then the environment:

===============================  ==========================  ======================================
variable                         config key                  meaning
===============================  ==========================  ======================================
``REWARDQ_REDIS_URL``            ``redis_url``               where the workers are (rediss://, cluster)
``REWARDQ_NAMESPACE``            ``namespace``               the workers' namespace
``REWARDQ_CLUSTER``              ``cluster``                 the URL is a Redis Cluster
``REWARDQ_VERL_TIMEOUT``         ``verl_timeout``            seconds to wait for one trajectory's rewards
``REWARDQ_VERL_ON_ERROR``        ``verl_on_error``           ``mask`` (default), ``zero`` or ``raise``
``REWARDQ_VERL_MAX_ERROR_RATE``  ``verl_max_error_rate``     failure budget: largest share of errors ...
``REWARDQ_VERL_ERROR_WINDOW``    ``verl_error_window``       ... among the run's last this many trajectories
===============================  ==========================  ======================================

:func:`where` names the setting a value came from (``REWARDQ_REDIS_URL``, ``reward.rewardq.redis_url``),
so an error says what to change.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rewardq.adapter_settings import AdapterSettings
from rewardq.errors import ConfigError

#: The verl config blocks the settings are read from (the later one wins).
BLOCKS = ("rewardq", "reward.rewardq")


def settings_for(config: object, env: Mapping[str, str] | None = None) -> AdapterSettings:
    """The adapter's settings for a verl config (an OmegaConf ``DictConfig``, a dict or None)."""
    block: dict[str, Any] = {}
    blocks: dict[str, str] = {}  # key -> the block it was read from
    for path in BLOCKS:
        found = config_at(config, path)
        if found is not None:
            if not isinstance(found, Mapping):
                raise ConfigError(f"the verl config's {path} must be a mapping of rewardq settings, got {found!r:.80}")
            block.update(found)
            blocks.update(dict.fromkeys(map(str, found), path))
    settings = AdapterSettings.load(block, os.environ if env is None else env)
    for name, source in list(settings.sources.items()):  # "rewardq config KEY" -> "reward.rewardq.KEY"
        key = AdapterSettings.settings()[name].key
        if source.startswith("rewardq config") and key in blocks:
            settings.sources[name] = f"{blocks[key]}.{key}"
    return settings


def where(settings: AdapterSettings, name: str) -> str:
    """The setting that set ``name``: where its value came from, or how to set it when it is the default."""
    source = settings.sources.get(name, "")
    s = AdapterSettings.settings()[name]
    if source.startswith("env "):
        return source[len("env ") :]
    if source and not source.startswith("rewardq config"):
        return source
    return f"the default; set {s.env} or reward.rewardq.{s.key}"


def config_at(config: object, path: str) -> object:
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
