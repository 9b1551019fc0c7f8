"""``rewardq worker``: command-line flags in, one running reward worker out.

The flags are a thin door into :class:`~rewardq.config.WorkerConfig`: each is made from one
setting's declaration (:func:`rewardq.ops.flags.click_options`) and named as it, and only flags
actually given become overrides, so the precedence is

    defaults  <  --config FILE  <  REWARDQ_* environment  <  flags.

The door keeps only what belongs to the process: logging (set up by ``rewardq worker`` before
either one worker or a supervisor of several starts), signals, and waiting for Redis. The
worker itself is put together by :mod:`rewardq.consumers.compose`, as every worker is. Start-up
order, each step failing with a message that says what to fix:

1. build the tokenizer, the manager and its context
   (:func:`~rewardq.consumers.compose.prepare_worker`): exit 2 on an unknown ``--manager``, no
   ``--tokenizer`` or a tokenizer path that is not there (said before torch is imported), and on
   a tokenizer that cannot be loaded or a manager option it refuses;
2. PING Redis until it answers, with backoff and one log line per attempt, for up to
   ``--connect-timeout`` seconds (default: forever), then exit 3 with the redacted URL; refused
   credentials exit at once; a SIGTERM or Ctrl-C ends the wait within a fraction of a second
   (exit 0, with a log line saying so);
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
from typing import Any

from rewardq.config import WorkerConfig
from rewardq.consumers.compose import prepare_worker
from rewardq.consumers.compose import run_worker as run_composed
from rewardq.consumers.process import EarlySignals
from rewardq.errors import ConfigError
from rewardq.logs import startup_step
from rewardq.queue.connection import redact_url
from rewardq.queue.reachability import wait_for_redis
from rewardq.reward.codeexec.settings import OPTION_NAMES as CODE_OPTIONS
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.options import option_rows
from rewardq.reward.registry import options_of
from rewardq.reward.scoring_fingerprint import shown_settings
from rewardq.settings import flag_argv, flag_values

logger = logging.getLogger("rewardq.cli")

__all__ = [
    "overrides_from_flags",
    "load_config",
    "config_rows",
    "run_worker",
    "worker_argv",
]


def overrides_from_flags(params: Mapping[str, object]) -> dict[str, tuple[object, str]]:
    """The WorkerConfig overrides for the flags that were given (None means "not given"):
    setting name -> (value, ``flag --x``)."""

    return {name: (value, f"flag {flag}") for name, (value, flag) in flag_values(WorkerConfig, params).items()}


def load_config(params: Mapping[str, Any], env: Mapping[str, str] | None = None) -> WorkerConfig:
    """Defaults < ``--config`` < environment < flags, validated."""

    return WorkerConfig.load(config_file=params.get("config"), env=env, overrides=overrides_from_flags(params))


def config_rows(cfg: WorkerConfig) -> list[dict[str, Any]]:
    """One row per setting: name, value (password redacted), source, flag and environment variable;
    then one per option of the manager (``manager_options.<name>``, a credential as ``***``; see
    :func:`rewardq.reward.options.option_rows`)."""

    values = shown_settings(cfg)
    rows = [
        {"name": n, "value": values[n], "source": cfg.sources.get(n, "default"), "flag": s.flag, "env": s.env}
        for n, s in cfg.settings().items()
    ]
    options = cfg.settings()["manager_options"]
    try:
        declared = options_of(cfg.manager)
    except ConfigError:  # an unknown manager: the options as given (the worker refuses the manager)
        declared = None
    given = dict(cfg.manager_options or {})
    code = {k: given.pop(k) for k in sorted(CODE_OPTIONS & set(given))}  # every manager takes these
    source = cfg.sources.get("manager_options", "default")
    prefix = "manager_options."
    each = {k[len(prefix) :]: v for k, v in cfg.sources.items() if k.startswith(prefix)}  # the layer per option
    for row in option_rows(declared, given, source, each) + option_rows(CodeExecSettings, code, source, each):
        rows.append({**row, "flag": "--manager-option", "env": options.env})
    return rows


def worker_argv(params: Mapping[str, object], *, leave_out: Iterable[str] = ()) -> list[str]:
    """The ``rewardq worker`` arguments that reproduce ``params`` (``--processes`` left out)."""

    argv: list[str] = []
    if params.get("config"):
        argv += ["--config", str(params["config"])]
    return argv + flag_argv(WorkerConfig, params, leave_out=leave_out)


def run_worker(cfg: WorkerConfig, early: EarlySignals) -> int:
    """Build, check and run one worker (see the module docstring); returns the exit code."""

    prepared = prepare_worker(cfg)  # before waiting for Redis: a wrong manager or tokenizer must not wait
    try:
        with startup_step(logger, f"connecting to Redis at {redact_url(cfg.redis_url)}"):
            if wait_for_redis(
                cfg.redis_url, cluster=cfg.cluster, timeout=cfg.connect_timeout, stopping=lambda: early.received
            ):
                raise _Stopped  # the step did not finish: no "done" line
    except _Stopped:  # the wait logged which signal stopped it
        return 0
    if early.received:
        logger.info("received %s during start-up; exiting", early.received)
        return 0
    asyncio.run(run_composed(prepared, own_process=True, early=early))  # it serves --metrics-port itself
    return 0


class _Stopped(Exception):
    """A stop signal ended the wait for Redis."""
