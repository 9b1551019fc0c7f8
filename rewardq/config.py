"""rewardq's settings: each declared once, in :class:`WorkerConfig` (and :class:`AdapterSettings`,
the verl adapter's, which shares the worker's declarations of where Redis is).

Precedence (lowest to highest): defaults < config file (``--config``) < environment
(``REWARDQ_<NAME>``, e.g. ``REWARDQ_REDIS_URL``) < command-line flags (``--<name>``).

Each field is one :func:`~rewardq.settings.setting` declaration: type, default, help text and
bounds. The environment variable, the config-file key, the ``rewardq worker`` flag with its
``--help`` line, the checks and ``rewardq config``'s "where did this come from" are all derived
from it (:mod:`rewardq.settings`, :mod:`rewardq.ops.flags`), so adding a setting is one
declaration here::

    drain_grace: float = setting(defaults.DRAIN_GRACE, "Seconds a draining worker waits.", above=0)

gives ``--drain-grace`` (with ``[default: ...; env: REWARDQ_DRAIN_GRACE]`` in ``--help``), the
variable, the file key ``drain_grace``, the check, and a row of ``rewardq config``. Its default
is named in :mod:`rewardq.defaults` (``tests/unit/test_defaults.py`` refuses a numeric literal
default anywhere else). ``choices=``, ``minimum=``/``above=``/``maximum=``, ``shown_default=`` (for a
None that means something) and ``passed_to="broker"`` (a keyword argument of the same name of
:class:`~rewardq.queue.broker.StreamBroker`) say the rest; see :func:`rewardq.settings.setting`.

A config file is YAML (or JSON) holding our own keys at top level, or verl's whole trainer
config (its ``reward:`` block and the rest, read as verl reads them: :mod:`rewardq.verl_config`),
or both: rewardq keys beside verl's sections, in a ``rewardq:`` block or in ``reward.rewardq``.
File values are type-checked as environment variables are (``cluster: "false"`` is False, a
word where a number belongs is an error naming the file and key). Keys rewardq does not use are
collected in ``WorkerConfig.unused_keys`` and listed once when the worker starts; they never
stop it.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rewardq import defaults
from rewardq.errors import ConfigError
from rewardq.settings import (
    ENV_PREFIX,
    FALSE_WORDS,
    TRUE_WORDS,
    Layers,
    Setting,
    check_bounds,
    choice_of,
    env_values,
    file_value,
    parse_bool,
    same_as,
    setting,
    settings_of,
)

__all__ = [
    "ENV_PREFIX",
    "TRUE_WORDS",
    "FALSE_WORDS",
    "parse_bool",
    "WorkerConfig",
    "AdapterSettings",
    "ADAPTER_KEYS",
    "LoadedFile",
    "parse_file",
    "read_config_file",
    "translate_verl_reward",
]

#: Log levels ``log_level`` accepts (in any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _manager_names() -> str:
    """The managers ``--manager`` takes, found when ``--help`` is shown (entry points included)."""
    from rewardq.reward.registry import listed_managers

    return f"One of: {', '.join(listed_managers())}; or package.module:Class, or FILE.py:Class."


@dataclass
class WorkerConfig:
    """Everything a reward worker needs to know: one declaration per setting (module docstring)."""

    # where
    redis_url: str = setting(defaults.REDIS_URL, "redis://[user:pass@]host:port/db, rediss://, redis+cluster://.")
    redis_url_file: str | None = setting(
        None,
        "A file whose first line is the Redis URL, which then replaces redis_url from any layer but "
        "--redis-url: keeps the password off command lines and environments.",
        metavar="PATH",
    )
    cluster: bool = setting(False, "Treat --redis-url as a Redis Cluster.")
    namespace: str = setting(defaults.NAMESPACE, "First component of every key; producers must use the same.")
    group: str = setting(defaults.GROUP, "Consumer group the workers of one pipeline share.")
    shards: int | None = setting(
        None, "Stream shards (must match the namespace's).", above=0, shown_default="the namespace's (1 if new)"
    )
    name: str | None = setting(None, "Consumer name of this worker.", shown_default="<host>-<pid>-<random>")
    # what
    manager: str = setting(defaults.MANAGER, "Reward manager.", more_help=_manager_names)
    manager_options: dict[str, Any] = setting(
        {},
        "Manager option (repeatable); VALUE is JSON if it parses, else a string; a.b=1 nests.",
        flag="--manager-option",
        metavar="KEY=VALUE",
        pairs=True,
        merge=True,
    )
    tokenizer: str | None = setting(
        None,
        "Required: the trainer's tokenizer (a Hugging Face folder, a Hub id in the local Hugging Face cache, "
        "a tokenizer.json), or builtin:demo for the demo's data. From a verl --config: its model.path.",
        shown_default="none, required",
    )
    reward_fn: str | None = setting(
        None, "Custom scoring function: FILE.py[:FUNC] or package.module[:FUNC].", shown_default="the default scorer"
    )
    reward_fn_kwargs: dict[str, Any] = setting(
        {},
        "JSON object of extra keyword arguments for --reward-fn.",
        flag="--reward-kwargs",
        aliases=("--reward-fn-kwargs",),
        metavar="JSON",
        merge=True,
    )
    reward_fn_placement: str = setting(
        defaults.REWARD_FN_PLACEMENT,
        "Where a sync --reward-fn runs: scorer processes, threads, or inline (trusted, cheap code only).",
        choices=defaults.REWARD_FN_PLACEMENTS,
    )
    takeover: bool = setting(
        defaults.TAKEOVER,
        "Rolling upgrade: when the namespace records another scoring configuration, wait until no live "
        "worker runs it, then record this one (without it such a worker refuses to start).",
    )
    scorer_processes: int | None = setting(
        defaults.SCORER_PROCESSES, "Scorer processes per function.", above=0, shown_default="one per core, at least 2"
    )
    scorer_spares: int = setting(
        defaults.SCORER_SPARES, "Spare scorer processes at most, for calls waiting behind stuck ones.", minimum=0
    )
    # how much
    concurrency: int = setting(defaults.CONCURRENCY, "Trajectories scored at once by one worker.", above=0)
    batch_size: int = setting(defaults.BATCH_SIZE, "Stream entries per read.", above=0)
    block_ms: int = setting(defaults.BLOCK_MS, "Longest blocking read, in milliseconds (0: do not block).", minimum=0)
    score_timeout: float = setting(defaults.SCORE_TIMEOUT, "Seconds one trajectory's scoring may take.", above=0)
    retry_for: float = setting(
        defaults.RETRY_FOR,
        "Seconds a trajectory whose scoring failed for a transient reason (a judge answering 429/5xx, "
        "SandboxFusion down, a lost connection) is scored again, after backoffs honouring Retry-After, "
        "before it becomes an error result of kind transient (0: never retried).",
        minimum=0,
    )
    # recovery
    claim_idle: float = setting(
        defaults.CLAIM_IDLE, "Seconds an entry stays pending before another worker reclaims it.", above=0
    )
    max_deliveries: int = setting(defaults.MAX_DELIVERIES, "Deliveries before an entry is dead-lettered.", above=0)
    max_crashes: int = setting(
        defaults.MAX_CRASHES,
        "Worker deaths while a trajectory is scored alone before it gets an error result.",
        above=0,
    )
    lease_seconds: float = setting(
        defaults.LEASE_SECONDS,
        "Seconds a trajectory stays leased to its worker without renewal.",
        above=0,
        passed_to="broker",
    )
    heartbeat_interval: float = setting(
        defaults.HEARTBEAT_INTERVAL, "Seconds between heartbeats (and lease renewals).", above=0
    )
    maintenance_interval: float = setting(
        defaults.MAINTENANCE_INTERVAL,
        "Seconds between maintenance passes (reclaim, expiry of incomplete trajectories).",
        above=0,
    )
    incomplete_timeout: float = setting(
        defaults.INCOMPLETE_TIMEOUT,
        "Seconds a trajectory may wait for missing outputs before every key gets an error.",
        above=0,
        passed_to="broker",
    )
    result_ttl: float = setting(
        defaults.RESULT_TTL, "Seconds results are kept (0: forever).", minimum=0, passed_to="broker"
    )
    keep_records: float = setting(
        defaults.KEEP_RECORDS,
        "Seconds an ended trajectory's outputs (scored or failed) stay for `rewardq inspect` and "
        "`rewardq dead-letters retry` (0: deleted once its result is written).",
        minimum=0,
        passed_to="broker",
    )
    shutdown_grace: float = setting(
        defaults.SHUTDOWN_GRACE,
        "Seconds a stopping worker lets in-flight scoring finish before handing it back.",
        above=0,
    )
    max_record_bytes: int = setting(
        defaults.MAX_RECORD_BYTES, "Largest record, in bytes; larger ones are dead-lettered.", above=0
    )
    max_image_bytes: int = setting(
        defaults.MAX_IMAGE_BYTES,
        "Largest encoded image (PNG/JPEG/WebP) in a record's multi_modal_data, in bytes; larger ones are "
        "dead-lettered (producers refuse them naming the output and the image).",
        above=0,
    )
    max_trajectory_bytes: int = setting(
        defaults.MAX_TRAJECTORY_BYTES,
        "Largest total of one trajectory's records, in bytes; past it every key gets an error result.",
        above=0,
        passed_to="broker",
    )
    max_batch_bytes: int = setting(
        defaults.MAX_BATCH_BYTES,
        "Largest padded batch of one trajectory, in bytes, checked before it is built; past it every key "
        "gets an error result.",
        above=0,
    )
    max_result_bytes: int = setting(
        defaults.MAX_RESULT_BYTES,
        "Largest stored result of one key, reward_extra_info included, in bytes; a larger one becomes an "
        "error result naming it.",
        minimum=1,
        maximum=defaults.MAX_RESULT_BYTES_LIMIT,
        bound_why="Redis refuses a string over 512 MiB",
        passed_to="broker",
    )
    max_outputs: int = setting(
        defaults.MAX_OUTPUTS,
        "Outputs one trajectory may have; bounds every Lua script's work.",
        minimum=1,
        maximum=defaults.MAX_OUTPUTS_LIMIT,
        bound_why="every Lua script's worst-case run time grows with it; the default 4096 keeps each under ~50 ms",
        passed_to="broker",
    )
    connect_timeout: float | None = setting(
        defaults.WORKER_CONNECT_TIMEOUT,
        "Seconds to wait for Redis at start-up, retrying with backoff.",
        above=0,
        shown_default="forever",
    )
    # the reward ledger (rewardq.ledger, docs/ledger.md)
    ledger: str | None = setting(
        None,
        "Keep every scored trajectory (sample, ids, decoded response, result, provenance, timings) in a "
        "Parquet ledger: a local folder or an fsspec URL (s3://, gs://, ...). Needs the `ledger` extra.",
        metavar="PATH_OR_URL",
        shown_default="off",
    )
    ledger_spool: str | None = setting(
        None,
        "Local folder of the ledger's write-ahead spool (trajectories land there before their commit and "
        "survive a killed worker); must outlive the worker process, on a local disk.",
        metavar="DIR",
        shown_default="<ledger>/_spool/<host> for a local ledger, else ~/.cache/rewardq/ledger-spool/<digest>",
    )
    ledger_flush_interval: float = setting(
        defaults.LEDGER_FLUSH_INTERVAL, "Seconds the spool collects before it is written as one Parquet file.", above=0
    )
    ledger_file_bytes: int = setting(
        defaults.LEDGER_FILE_BYTES, "Spooled bytes after which a Parquet file is written early.", above=0
    )
    ledger_spool_max_bytes: int = setting(
        defaults.LEDGER_SPOOL_MAX_BYTES,
        "Spooled bytes not yet written (the ledger refusing files) past which trajectories are counted as "
        "unwritten instead of spooled.",
        above=0,
    )
    # observability
    metrics_port: int | None = setting(
        None, "Serve Prometheus metrics on this port (0: any free port).", minimum=0, shown_default="off"
    )
    log_level: str = setting(defaults.LOG_LEVEL, "Log level.", choices=LOG_LEVELS, ignore_case=True)
    log_format: str = setting(defaults.LOG_FORMAT, "text, or one JSON object per line.", choices=("text", "json"))
    # bookkeeping, not settings: keys of the config file rewardq does not use, and where each value came from
    unused_keys: list[str] = field(default_factory=list, repr=False, compare=False)
    sources: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    config_file: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def settings(cls) -> dict[str, Setting]:
        """Every declared setting, by name, in declaration order."""
        return settings_of(cls)

    def secret_files(self) -> tuple[str, ...]:
        """The files holding this worker's secrets: the Redis URL file, the config file (it may
        hold a password) and a TLS client key the URL names (``?ssl_keyfile=``). No sandboxed
        program may read them (docs/code-execution.md)."""
        keys = parse_qs(urlsplit(self.redis_url).query).get("ssl_keyfile", [])
        return tuple(p for p in (self.redis_url_file, self.config_file, *keys) if p)

    def arguments_for(self, component: str) -> dict[str, Any]:
        """The settings declared ``passed_to=component``, as that component's keyword arguments."""
        return {n: getattr(self, n) for n, s in self.settings().items() if s.spec.passed_to == component}

    def validate(self) -> WorkerConfig:
        """Check every value against its declaration, then the rules between settings; returns self."""
        for name, s in self.settings().items():
            value = getattr(self, name)
            check_bounds(s, value, self.sources.get(name, ""))
            if s.spec.choices:  # stored as declared: "info" from a file is INFO
                setattr(self, name, choice_of(s, str(value)))
        if self.claim_idle <= self.heartbeat_interval:
            raise ConfigError(
                f"claim_idle ({self.claim_idle}s) must exceed heartbeat_interval "
                f"({self.heartbeat_interval}s), or live workers' entries get reclaimed"
            )
        if self.lease_seconds <= self.heartbeat_interval:
            raise ConfigError(
                f"lease_seconds ({self.lease_seconds}) must exceed heartbeat_interval "
                f"({self.heartbeat_interval}) or leases lapse between renewals"
            )
        if self.max_trajectory_bytes < self.max_record_bytes:
            raise ConfigError(
                f"max_trajectory_bytes ({self.max_trajectory_bytes}) must be at least max_record_bytes "
                f"({self.max_record_bytes}): a trajectory holds at least one record"
            )
        return self

    # -- doors -----------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        *,
        config_file: str | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        override_source: str = "flag",
    ) -> WorkerConfig:
        """Defaults, then ``config_file``, then environment, then ``overrides`` (CLI flags).

        Where each value came from ends up in :attr:`sources` (``default``, ``file PATH``,
        ``env REWARDQ_X``, ``flag --x``); keys of the file that rewardq does not use in
        :attr:`unused_keys` (the worker lists them once at start-up); they never fail the load.
        ``overrides`` maps setting names to values, or to ``(value, source)`` pairs.
        """
        layers = Layers()
        unused: list[str] = []
        if config_file:
            loaded = read_config_file(config_file)
            for name, value in loaded.values.items():
                layers.put(cls.settings()[name], value, loaded.sources.get(name, f"file {config_file}"))
            unused = loaded.unused
        for name, (value, var) in env_values(cls, os.environ if env is None else env).items():
            layers.put(cls.settings()[name], value, f"env {var}")
        known = cls.settings()
        for name, given in (overrides or {}).items():
            if name not in known:
                raise ConfigError(f"unknown setting {name!r}; known settings: {sorted(known)}")
            # a plain None means "not given"; (None, source) sets an optional setting to None
            value, source = given if isinstance(given, tuple) else (given, override_source)
            if value is not None or isinstance(given, tuple):
                layers.put(known[name], value, source)
        cfg = cls(**layers.values)
        cfg.sources = {name: layers.sources.get(name, "default") for name in known}
        cfg.unused_keys = unused
        cfg.config_file = config_file
        if cfg.redis_url_file and not cfg.sources["redis_url"].startswith("flag"):
            cfg.redis_url = read_url_file(cfg.redis_url_file)
            cfg.sources["redis_url"] = f"redis_url_file {cfg.redis_url_file}"
        return cfg.validate()


def read_url_file(path: str) -> str:
    """The Redis URL on the first line of ``path``.

    Raises:
        ConfigError: the file cannot be read or its first line is not a URL.
    """
    try:
        with open(path, encoding="utf-8") as f:
            url = f.readline().strip()
    except OSError as exc:
        raise ConfigError(f"redis_url_file {path}: cannot read the Redis URL file ({exc.strerror})") from None
    if "://" not in url:
        raise ConfigError(f"redis_url_file {path}: the file's first line must be a Redis URL (redis://...)")
    return url


@dataclass
class AdapterSettings:
    """What the verl adapter (:mod:`rewardq.integrations.verl`) reads, in verl's rollout processes.

    Lowest precedence first: the defaults, the verl config's ``rewardq`` / ``reward.rewardq``
    block (the keys below), then the ``REWARDQ_*`` environment (a variable set to "" counts as
    unset). ``redis_url``, ``namespace`` and ``cluster`` are the worker's own declarations.
    """

    redis_url: str = same_as(WorkerConfig, "redis_url")
    namespace: str = same_as(WorkerConfig, "namespace")
    cluster: bool = same_as(WorkerConfig, "cluster")
    timeout: float = setting(
        defaults.VERL_TIMEOUT, "Seconds the adapter waits for one trajectory's rewards.", key="verl_timeout", above=0
    )
    on_error: str = setting(
        defaults.VERL_ON_ERROR,
        "What a trajectory that got no reward does to the rollout.",
        key="verl_on_error",
        choices=("mask", "zero", "raise"),
        ignore_case=True,
        bound_why="mask: the sample is left out of training (docs/verl-integration.md); "
        "zero: an error scores 0.0 and its message goes to reward_error; raise: the error stops the run",
    )
    max_error_rate: float = setting(
        defaults.VERL_MAX_ERROR_RATE,
        "Failure budget: the largest share of errors among the run's last verl_error_window trajectories, "
        "counted in Redis across every adapter and hook process; more stops the run (1: never).",
        key="verl_max_error_rate",
        minimum=0,
        maximum=1,
        bound_why="a share of trajectories",
    )
    error_window: int = setting(
        defaults.VERL_ERROR_WINDOW,
        "Failure budget: how many of the run's last trajectories the share of errors is taken over.",
        key="verl_error_window",
        minimum=1,
        maximum=defaults.VERL_ERROR_WINDOW_MAX,
    )
    sources: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def settings(cls) -> dict[str, Setting]:
        """Every declared setting, by name, in declaration order."""
        return settings_of(cls)

    @classmethod
    def load(cls, block: Mapping[str, Any] | None, env: Mapping[str, str]) -> AdapterSettings:
        """Defaults < ``block`` (the verl config's rewardq settings, by key) < ``env``, checked."""
        layers = Layers()
        by_key = {s.key: s for s in cls.settings().values()}
        for key, value in (block or {}).items():
            s = by_key.get(key)
            if s is not None and value is not None:
                layers.put(s, file_value(s, value, "the verl config's rewardq block"), f"rewardq config {key}")
        for name, (value, var) in env_values(cls, env, skip_empty=True).items():
            layers.put(cls.settings()[name], value, f"env {var}")
        out = cls(**layers.values)
        out.sources = dict(layers.sources)
        for name, s in cls.settings().items():
            check_bounds(s, getattr(out, name), out.sources.get(name, ""))
            if s.spec.choices:
                setattr(out, name, choice_of(s, str(getattr(out, name))))
        return out


#: Settings only the verl adapter reads; workers accept them in a shared config file without
#: listing them as unused.
ADAPTER_KEYS = (
    frozenset(s.key for s in settings_of(AdapterSettings).values())
    - {s.key for s in settings_of(WorkerConfig).values()}
) | {"fleet"}  # fleet: the Ray fleet the adapter starts (rewardq.integrations.verl_fleet)


@dataclass
class LoadedFile:
    """A config file's WorkerConfig values, where in the file each came from, and the keys rewardq
    does not use (dotted paths)."""

    values: dict[str, Any]
    unused: list[str]
    sources: dict[str, str] = field(default_factory=dict)


def parse_file(path: str) -> dict[str, Any]:
    """The mapping a YAML/JSON config file holds (ConfigError when it is missing or malformed)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = p.read_text()
    import yaml

    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:  # JSON's errors are ValueErrors; deep nesting
        raise ConfigError(f"cannot parse config file {path}: {exc}") from None
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at top level")
    return data


def read_config_file(path: str) -> LoadedFile:
    """Read a rewardq config file, or verl's trainer config (see :mod:`rewardq.verl_config`).

    Precedence inside one file: what a verl config implies < top-level rewardq keys < a
    top-level ``rewardq:`` block < a ``reward.rewardq`` block. Every value is type-checked
    (:func:`rewardq.settings.file_value`); keys that are neither WorkerConfig fields nor verl's are listed in
    :attr:`LoadedFile.unused`, with a suggestion when one looks like a misspelt field.
    """
    from rewardq.verl_config import VERL_SECTIONS, is_verl_config, translate

    data = parse_file(path)
    known = {s.key: s for s in WorkerConfig.settings().values()}
    layers: list[tuple[str, Mapping[str, Any]]] = []
    unused: list[str] = []
    origins: dict[str, str] = {}
    verl = is_verl_config(data)
    if verl:
        translated = translate(data)
        layers.append(("verl config", translated.values))
        unused += translated.unused
        origins = translated.origins
    top = {k: v for k, v in data.items() if not (verl and k in VERL_SECTIONS) and k != "rewardq"}
    layers.append(("", top))
    for block_path, block in (("rewardq", data.get("rewardq")), ("reward.rewardq", _reward_block(data))):
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise ConfigError(f"{path}: {block_path} must be a mapping of rewardq settings, got {block!r:.80}")
        layers.append((block_path, block))
    found = Layers()
    for prefix, layer in layers:
        for key, value in layer.items():
            dotted = f"{prefix}.{key}" if prefix and prefix != "verl config" else str(key)
            if key in ADAPTER_KEYS:
                continue
            if key not in known:
                unused.append(dotted + _suggestion(str(key), known))
                continue
            where = f"{path} ({prefix})" if prefix else path
            if prefix == "verl config" and key in origins:  # the verl key it came from, for errors
                where = f"{path} ({origins[key]})"
            found.put(known[key], file_value(known[key], value, where), f"file {where}")
    return LoadedFile(found.values, unused, found.sources)


def _reward_block(data: Mapping[str, Any]) -> object:
    reward = data.get("reward")
    return reward.get("rewardq") if isinstance(reward, Mapping) else None


def _suggestion(key: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if close else ""


def translate_verl_reward(reward: Mapping[str, Any]) -> dict[str, Any]:
    """Map a verl ``reward:`` block alone onto WorkerConfig fields (see :mod:`rewardq.verl_config`)."""
    from rewardq.verl_config import translate

    return translate({"reward": dict(reward)}).values
