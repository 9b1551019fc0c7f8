"""``rewardq worker``: command-line flags in, one running reward worker out.

The flags are a thin door into :class:`~rewardq.config.WorkerConfig`: each is made from one
setting's declaration (:func:`rewardq.ops.flags.click_options`) and named as it, and only flags
actually given become overrides, so the precedence is

    defaults  <  --config FILE  <  REWARDQ_* environment  <  flags.

Start-up order, each step failing with a message that says what to fix:

1. load the configuration and the tokenizer (exit 2 on a bad value, on no ``--tokenizer`` at all,
   and on a tokenizer that cannot be loaded: the message names its path and how to get it);
2. PING Redis until it answers, with backoff and one log line per attempt, for up to
   ``--connect-timeout`` seconds (default: forever), then exit 3 with the redacted URL; refused
   credentials exit at once;
3. build the manager, tokenizer and scoring function before the worker starts, so a
   misspelt ``--manager`` fails with the list of known managers (exit 2) instead of
   inside the worker's start-up;
4. run :class:`~rewardq.consumers.worker.Worker` until SIGTERM/SIGINT, then exit 0.

A signal that arrives while the worker is still starting is remembered
(:class:`EarlySignals`) and stops it as soon as it runs, still with exit code 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError

if TYPE_CHECKING:
    from rewardq.config import WorkerConfig
    from rewardq.reward.base import RewardManager
    from rewardq.reward.tokenizer import Tokenizer

logger = logging.getLogger("rewardq.cli")

__all__ = [
    "EarlySignals",
    "overrides_from_flags",
    "load_config",
    "effective_config",
    "config_rows",
    "run_worker",
    "worker_argv",
]


class EarlySignals:
    """Remember SIGTERM/SIGINT received before the worker's own handlers are installed.

    ``target`` (the worker's ``request_stop``) is called when set; ``received`` holds the
    signal's name.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self.target: Callable[[str], None] | None = None

    def install(self) -> EarlySignals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signal.Signals(signum).name
        if self.target is not None:
            self.target(self.received)


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


def effective_config(cfg: WorkerConfig) -> dict[str, Any]:
    """Every setting's value, as logged at start-up (password redacted)."""
    from rewardq.queue.connection import redact_url

    d = {name: getattr(cfg, name) for name in cfg.settings()}
    d["redis_url"] = redact_url(d["redis_url"])
    return d


def config_rows(cfg: WorkerConfig) -> list[dict[str, Any]]:
    """One row per setting: name, value (password redacted), source, flag and environment variable."""
    values = effective_config(cfg)
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


async def _serve(cfg: WorkerConfig, manager: RewardManager, tokenizer: Tokenizer, early: EarlySignals) -> None:
    from rewardq.consumers.worker import Worker

    worker = Worker(cfg, manager=manager, tokenizer=tokenizer)
    early.target = worker.request_stop
    if early.received:
        worker.request_stop(early.received)
    await worker.run(install_signal_handlers=True, freeze_heap=True)


def run_worker(cfg: WorkerConfig, early: EarlySignals) -> int:
    """Build, check and run one worker (see the module docstring); returns the exit code."""
    from rewardq.logs import setup_logging, startup_step
    from rewardq.ops.connect import wait_for_redis
    from rewardq.queue.connection import redact_url, split_cluster
    from rewardq.queue.meta import default_worker_name
    from rewardq.reward.base import ManagerContext

    try:
        setup_logging(cfg.log_level, cfg.log_format)
    except ValueError as exc:
        raise ConfigError(f"log settings: {exc}") from None
    cfg.name = cfg.name or default_worker_name()
    eff = effective_config(cfg)
    logger.info(
        "effective config: %s",
        json.dumps(eff, sort_keys=True, default=str),
        extra={"config": eff, "sources": dict(cfg.sources)},
    )
    if cfg.unused_keys:
        logger.warning(
            "config file: rewardq does not use %d key(s), ignoring them: %s",
            len(cfg.unused_keys),
            ", ".join(cfg.unused_keys),
        )
    with startup_step(logger, "importing torch, tensordict and the reward managers"):
        import tensordict  # noqa: F401 - the worker needs both; importing them is most of a start-up
        import torch  # noqa: F401

        from rewardq.reward.factory import build_from_config, load_worker_tokenizer
    with startup_step(logger, f"loading the tokenizer ({cfg.tokenizer})"):
        tokenizer = load_worker_tokenizer(cfg)  # before waiting for Redis: a wrong tokenizer must not wait
    with startup_step(logger, f"connecting to Redis at {redact_url(cfg.redis_url)}"):
        wait_for_redis(cfg.redis_url, cluster=cfg.cluster, timeout=cfg.connect_timeout)
    cluster = split_cluster(cfg.redis_url, cfg.cluster)[1]
    ctx = ManagerContext(
        redis_url=cfg.redis_url,
        namespace=cfg.namespace,
        worker_name=cfg.name,
        cluster=cluster,
        secret_files=cfg.secret_files(),
    )
    with startup_step(logger, f"building the {cfg.manager} manager"):
        manager, tokenizer = build_from_config(cfg, ctx, tokenizer)
    # the manager's own context holds the code options: the rlimits warning, the start-up probe, a refusal
    getattr(manager, "context", ctx).code_runtime().announce()
    if early.received:
        logger.info("received %s during start-up; exiting", early.received)
        return 0
    asyncio.run(_serve(cfg, manager, tokenizer, early))  # the worker serves --metrics-port itself
    return 0
