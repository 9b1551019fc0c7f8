"""``rewardq worker``: command-line flags in, one running reward worker out.

The flags are a thin door into :class:`~rewardq.config.WorkerConfig`: each is made from one
setting's declaration (:func:`rewardq.ops.flags.click_options`) and named as it, and only flags
actually given become overrides, so the precedence is

    defaults  <  --config FILE  <  REWARDQ_* environment  <  flags.

The door keeps only what belongs to the process: logging, signals, and waiting for Redis. The
worker itself is put together by :mod:`rewardq.consumers.compose`, as every worker is. Start-up
order, each step failing with a message that says what to fix:

1. set up logging; build the tokenizer, the manager and its context
   (:func:`~rewardq.consumers.compose.prepare_worker`): exit 2 on an unknown ``--manager``, no
   ``--tokenizer`` or a tokenizer path that is not there (said before torch is imported), and on
   a tokenizer that cannot be loaded or a manager option it refuses;
2. PING Redis until it answers, with backoff and one log line per attempt, for up to
   ``--connect-timeout`` seconds (default: forever), then exit 3 with the redacted URL; refused
   credentials exit at once;
3. open the worker and run it (:func:`~rewardq.consumers.compose.run_worker`) until
   SIGTERM/SIGINT, then exit 0.

A signal that arrives while the worker is still starting is remembered
(:class:`~rewardq.consumers.process.EarlySignals`) and stops it as soon as it can, still with exit
code 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rewardq.consumers.process import EarlySignals
from rewardq.errors import ConfigError

if TYPE_CHECKING:
    from rewardq.config import WorkerConfig

logger = logging.getLogger("rewardq.cli")

__all__ = [
    "overrides_from_flags",
    "load_config",
    "config_rows",
    "run_worker",
    "worker_argv",
]


def overrides_from_flags(params: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """The WorkerConfig overrides for the flags that were given (None means "not given"):
    setting name -> (value, ``flag --x``)."""
    from rewardq.config import WorkerConfig
    from rewardq.settings import flag_values

    return {name: (value, f"flag {flag}") for name, (value, flag) in flag_values(WorkerConfig, params).items()}


def load_config(params: Mapping[str, Any], env: Mapping[str, str] | None = None) -> WorkerConfig:
    """Defaults < ``--config`` < environment < flags, validated."""
    from rewardq.config import WorkerConfig

    return WorkerConfig.load(config_file=params.get("config"), env=env, overrides=overrides_from_flags(params))


def config_rows(cfg: WorkerConfig) -> list[dict[str, Any]]:
    """One row per setting: name, value (password redacted), source, flag and environment variable."""
    from rewardq.consumers.compose import effective_settings

    values = effective_settings(cfg)
    return [
        {"name": n, "value": values[n], "source": cfg.sources.get(n, "default"), "flag": s.flag, "env": s.env}
        for n, s in cfg.settings().items()
    ]


def worker_argv(params: Mapping[str, Any], *, leave_out: Iterable[str] = ()) -> list[str]:
    """The ``rewardq worker`` arguments that reproduce ``params`` (``--processes`` left out)."""
    from rewardq.config import WorkerConfig
    from rewardq.settings import flag_argv

    argv: list[str] = []
    if params.get("config"):
        argv += ["--config", str(params["config"])]
    return argv + flag_argv(WorkerConfig, params, leave_out=leave_out)


def run_worker(cfg: WorkerConfig, early: EarlySignals) -> int:
    """Build, check and run one worker (see the module docstring); returns the exit code."""
    from rewardq.consumers.compose import prepare_worker
    from rewardq.consumers.compose import run_worker as run_composed
    from rewardq.logs import setup_logging, startup_step
    from rewardq.ops.connect import wait_for_redis
    from rewardq.queue.connection import redact_url

    try:
        setup_logging(cfg.log_level, cfg.log_format)
    except ValueError as exc:
        raise ConfigError(f"log settings: {exc}") from None
    prepared = prepare_worker(cfg)  # before waiting for Redis: a wrong manager or tokenizer must not wait
    with startup_step(logger, f"connecting to Redis at {redact_url(cfg.redis_url)}"):
        wait_for_redis(cfg.redis_url, cluster=cfg.cluster, timeout=cfg.connect_timeout)
    if early.received:
        logger.info("received %s during start-up; exiting", early.received)
        return 0
    asyncio.run(run_composed(prepared, own_process=True, early=early))  # it serves --metrics-port itself
    return 0
