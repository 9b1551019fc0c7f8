"""``rewardq worker``: command-line flags in, one running reward worker out.

The flags are a thin door into :class:`~rewardq.config.WorkerConfig`: every flag names one
field, and only flags actually given become overrides, so the precedence is

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
import dataclasses
import json
import logging
import signal
from collections.abc import Callable, Mapping
from typing import Any

from rewardq.errors import ConfigError

logger = logging.getLogger("rewardq.cli")

__all__ = [
    "FLAG_FIELDS",
    "EarlySignals",
    "overrides_from_flags",
    "load_config",
    "run_worker",
    "worker_argv",
    "parse_manager_options",
]

#: click parameter name -> WorkerConfig field.
FLAG_FIELDS: dict[str, str] = {
    "redis_url": "redis_url",
    "namespace": "namespace",
    "manager": "manager",
    "tokenizer": "tokenizer",
    "reward_fn": "reward_fn",
    "reward_kwargs": "reward_fn_kwargs",
    "reward_fn_placement": "reward_fn_placement",
    "scorer_processes": "scorer_processes",
    "concurrency": "concurrency",
    "batch_size": "batch_size",
    "manager_option": "manager_options",
    "shards": "shards",
    "cluster": "cluster",
    "name": "name",
    "claim_idle": "claim_idle",
    "max_deliveries": "max_deliveries",
    "max_crashes": "max_crashes",
    "incomplete_timeout": "incomplete_timeout",
    "score_timeout": "score_timeout",
    "result_ttl": "result_ttl",
    "keep_records": "keep_records",
    "group": "group",
    "block_ms": "block_ms",
    "log_level": "log_level",
    "log_format": "log_format",
    "metrics_port": "metrics_port",
    "max_outputs": "max_outputs",
    "connect_timeout": "connect_timeout",
}


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

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum).name
        if self.target is not None:
            self.target(self.received)


def _json_or_str(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_manager_options(items: tuple[str, ...] | list[str]) -> dict:
    """``("max_rpm=60", "overlong_buffer.enable=true")`` -> ``{"max_rpm": 60, "overlong_buffer": {"enable": True}}``.

    Values are JSON when they parse as JSON (numbers, booleans, lists, objects, ``null``),
    otherwise plain strings. Dots in a key build nested dicts.
    """
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--manager-option {item!r} is not KEY=VALUE (e.g. --manager-option max_rpm=60)")
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--manager-option {item!r}: {p!r} was already given a plain value")
            node = child
        node[leaf] = _json_or_str(raw)
    return out


def overrides_from_flags(params: Mapping[str, Any]) -> dict[str, Any]:
    """The WorkerConfig overrides for the flags that were given (None means "not given")."""
    out: dict[str, Any] = {}
    for param, fld in FLAG_FIELDS.items():
        value = params.get(param)
        if value is None or (param == "manager_option" and not value):
            continue
        if param == "manager_option":
            value = parse_manager_options(value)
        elif param == "reward_kwargs":
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ConfigError(
                    f"--reward-kwargs must be a JSON object, e.g. '{{\"penalty\": 0.1}}' ({exc})"
                ) from None
            if not isinstance(value, dict):
                raise ConfigError(f"--reward-kwargs must be a JSON object, got {type(value).__name__}")
        out[fld] = value
    return out


def load_config(params: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Any:
    """Defaults < ``--config`` < environment < flags, validated."""
    from rewardq.config import WorkerConfig

    return WorkerConfig.load(config_file=params.get("config"), env=env, overrides=overrides_from_flags(params))


def effective_config(cfg: Any) -> dict[str, Any]:
    """The configuration as logged at start-up (password redacted)."""
    from rewardq.queue.connection import redact_url

    d = dataclasses.asdict(cfg)
    d.pop("unused_keys", None)  # listed on their own line
    d.pop("tokenizer_origin", None)
    d["redis_url"] = redact_url(d["redis_url"])
    return d


def worker_argv(params: Mapping[str, Any]) -> list[str]:
    """The ``rewardq worker`` arguments that reproduce ``params`` (``--processes`` left out)."""
    argv: list[str] = []
    if params.get("config"):
        argv += ["--config", str(params["config"])]
    for param in FLAG_FIELDS:
        value = params.get(param)
        if value is None:
            continue
        flag = "--" + param.replace("_", "-")
        if param == "cluster":
            argv.append("--cluster" if value else "--no-cluster")
        elif param == "manager_option":
            for item in value:
                argv += [flag, item]
        else:
            argv += [flag, str(value)]
    return argv


async def _serve(cfg: Any, manager: Any, tokenizer: Any, early: EarlySignals) -> None:
    from rewardq.consumers.worker import Worker

    worker = Worker(cfg, manager=manager, tokenizer=tokenizer)
    early.target = worker.request_stop
    if early.received:
        worker.request_stop(early.received)
    await worker.run(install_signal_handlers=True, freeze_heap=True)


def run_worker(cfg: Any, early: EarlySignals) -> int:
    """Build, check and run one worker (see the module docstring); returns the exit code."""
    from rewardq.logs import setup_logging
    from rewardq.ops.common import wait_for_redis
    from rewardq.queue.connection import split_cluster
    from rewardq.queue.meta import default_worker_name
    from rewardq.reward.base import ManagerContext
    from rewardq.reward.factory import build_from_config, load_worker_tokenizer

    try:
        setup_logging(cfg.log_level, cfg.log_format)
    except ValueError as exc:
        raise ConfigError(f"log settings: {exc}") from None
    cfg.name = cfg.name or default_worker_name()
    eff = effective_config(cfg)
    logger.info("effective config: %s", json.dumps(eff, sort_keys=True, default=str), extra={"config": eff})
    if cfg.unused_keys:
        logger.warning(
            "config file: rewardq does not use %d key(s), ignoring them: %s",
            len(cfg.unused_keys),
            ", ".join(cfg.unused_keys),
        )
    tokenizer = load_worker_tokenizer(cfg)  # before waiting for Redis: a wrong tokenizer must not wait
    wait_for_redis(cfg.redis_url, cluster=cfg.cluster, timeout=cfg.connect_timeout)
    cluster = split_cluster(cfg.redis_url, cfg.cluster)[1]
    ctx = ManagerContext(redis_url=cfg.redis_url, namespace=cfg.namespace, worker_name=cfg.name, cluster=cluster)
    manager, tokenizer = build_from_config(cfg, ctx, tokenizer)
    if early.received:
        logger.info("received %s during start-up; exiting", early.received)
        return 0
    asyncio.run(_serve(cfg, manager, tokenizer, early))  # the worker serves --metrics-port itself
    return 0
