"""The earlier name of :mod:`rewardq.integrations.verl.mask`, kept for running trainer configs.

A fully-async verl config names its Ray setup hook by path
(``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rewardq.integrations.verl_mask.register``);
such a config keeps working. New configs name ``rewardq.integrations.verl.mask.register``.
"""

from __future__ import annotations

from rewardq.integrations.verl.mask import register

__all__ = ["register"]
