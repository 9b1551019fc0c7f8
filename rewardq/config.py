"""Worker and client settings: one dataclass, with environment, file and CLI as thin doors.

Precedence (lowest to highest): defaults < config file (``--config``) < environment
(``REWARDQ_<FIELD>``, e.g. ``REWARDQ_REDIS_URL``) < command-line flags.

A config file is YAML (or JSON) holding our own fields at top level, or verl's whole trainer
config (its ``reward:`` block and the rest, read as verl reads them: :mod:`rewardq.verl_config`),
or both: rewardq keys beside verl's sections, in a ``rewardq:`` block or in ``reward.rewardq``.
File values are type-checked as environment variables are (``cluster: "false"`` is False, a
word where a number belongs is an error naming the file and key). Keys rewardq does not use are
collected in ``WorkerConfig.unused_keys`` and listed once when the worker starts; they never
stop it.

The coercion is written out here (~60 lines over the dataclass's own type hints) rather than
taken from a settings library: the core install must stay redis + msgpack + numpy, and the
worker extra must fit beside verl's pins without adding packages a verl environment lacks.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewardq import defaults
from rewardq.errors import ConfigError

ENV_PREFIX = "REWARDQ_"
#: Words a boolean setting accepts, in any case (environment, config file, the verl adapter's settings).
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(text: str) -> bool | None:
    """``text`` as a boolean word (:data:`TRUE_WORDS`, :data:`FALSE_WORDS`), or None when it is neither."""
    word = text.strip().lower()
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


@dataclass
class WorkerConfig:
    """Everything a reward worker needs to know. Every field is also ``REWARDQ_<NAME>``."""

    # where
    redis_url: str = defaults.REDIS_URL
    cluster: bool = False
    namespace: str = defaults.NAMESPACE
    group: str = defaults.GROUP
    shards: int | None = None  # None: whatever <ns>:meta says (1 for a new namespace)
    name: str | None = None  # consumer name; default <host>-<pid>-<rand>
    # what
    manager: str = "naive"
    manager_options: dict = field(default_factory=dict)
    tokenizer: str | None = None  # tokenizer.json, HF folder, or builtin:demo
    reward_fn: str | None = None  # FILE.py[:FUNC] or package.module[:FUNC]
    reward_fn_kwargs: dict = field(default_factory=dict)
    reward_fn_placement: str = defaults.REWARD_FN_PLACEMENT  # sync reward function: process | thread | inline
    scorer_processes: int | None = defaults.SCORER_PROCESSES  # per function; None: one per core (>= 2)
    # how much
    concurrency: int = defaults.CONCURRENCY  # trajectories scored at once by one worker
    batch_size: int = defaults.BATCH_SIZE  # entries per XREADGROUP
    block_ms: int = defaults.BLOCK_MS
    score_timeout: float = defaults.SCORE_TIMEOUT  # one trajectory's run_single, seconds
    # recovery
    claim_idle: float = defaults.CLAIM_IDLE  # seconds before another worker reclaims a pending entry
    max_deliveries: int = defaults.MAX_DELIVERIES  # deliveries before an entry is dead-lettered
    max_crashes: int = defaults.MAX_CRASHES  # worker deaths while a trajectory is scored alone
    lease_seconds: float = defaults.LEASE_SECONDS
    heartbeat_interval: float = defaults.HEARTBEAT_INTERVAL
    maintenance_interval: float = defaults.MAINTENANCE_INTERVAL
    incomplete_timeout: float = defaults.INCOMPLETE_TIMEOUT  # seconds a trajectory may wait for missing outputs
    result_ttl: float = defaults.RESULT_TTL  # 0 keeps results forever
    keep_records: float = 0.0  # seconds to keep a scored trajectory's outputs for `rewardq inspect`
    shutdown_grace: float = defaults.SHUTDOWN_GRACE
    max_record_bytes: int = defaults.MAX_RECORD_BYTES
    max_outputs: int = defaults.MAX_OUTPUTS  # outputs per trajectory; bounds every Lua script's work
    connect_timeout: float | None = defaults.WORKER_CONNECT_TIMEOUT  # None: wait for Redis forever
    # observability
    metrics_port: int | None = None
    log_level: str = "INFO"
    log_format: str = "text"  # text | json
    # bookkeeping, not settings: keys of the config file rewardq does not use; where the tokenizer came
    # from when a verl config named it (named in the error when it cannot be loaded)
    unused_keys: list[str] = field(default_factory=list, repr=False, compare=False, metadata={"internal": True})
    tokenizer_origin: str | None = field(default=None, repr=False, compare=False, metadata={"internal": True})

    def validate(self) -> WorkerConfig:
        def positive(name: str, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            if v is None:
                return
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (v == 0 and not allow_zero):
                raise ConfigError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, got {v!r}")

        for n in (
            "concurrency",
            "batch_size",
            "score_timeout",
            "claim_idle",
            "max_deliveries",
            "max_crashes",
            "lease_seconds",
            "heartbeat_interval",
            "maintenance_interval",
            "incomplete_timeout",
            "shutdown_grace",
            "max_record_bytes",
            "max_outputs",
            "shards",
            "connect_timeout",
            "scorer_processes",
        ):
            positive(n)
        if isinstance(self.max_outputs, bool) or not isinstance(self.max_outputs, int) or self.max_outputs > 1_000_000:
            raise ConfigError(
                f"max_outputs must be an integer from 1 to 1000000, got {self.max_outputs!r} (every Lua script's "
                "worst-case run time grows with it; the default 4096 keeps each under ~50 ms)"
            )
        for n in ("result_ttl", "block_ms", "keep_records"):
            positive(n, allow_zero=True)
        if str(self.log_level).upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {self.log_level!r}")
        if self.reward_fn_placement not in ("process", "thread", "inline"):
            raise ConfigError(
                f"reward_fn_placement must be process, thread or inline, got {self.reward_fn_placement!r}"
            )
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"log_format must be 'text' or 'json', got {self.log_format!r}")
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
        return self

    # -- doors -----------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        *,
        config_file: str | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> WorkerConfig:
        """Defaults, then ``config_file``, then environment, then ``overrides`` (CLI flags).

        Keys of the file that rewardq does not use end up in :attr:`unused_keys` (the worker
        lists them once at start-up); they never fail the load.
        """
        values: dict[str, Any] = {}
        unused: list[str] = []
        origins: dict[str, str] = {}
        if config_file:
            loaded = read_config_file(config_file)
            values.update(loaded.values)
            unused, origins = loaded.unused, loaded.origins
        from_environment = from_env(os.environ if env is None else env)
        values.update(from_environment)
        flags = {k: v for k, v in (overrides or {}).items() if v is not None}
        for k, v in flags.items():
            _set_layered(values, k, v)
        for k in (*from_environment, *flags):  # a value given later no longer comes from the file
            origins.pop(k, None)
        cfg = build(cls, values).validate()
        cfg.unused_keys = unused
        cfg.tokenizer_origin = origins.get("tokenizer")
        return cfg


#: Settings only the verl adapter reads (:mod:`rewardq.integrations.verl`); workers accept them in a
#: shared config file without listing them as unused.
ADAPTER_KEYS = frozenset({"verl_timeout", "verl_on_error", "verl_max_error_rate", "verl_error_window"})


#: Dict settings whose layers merge key by key (a flag's manager option beside the file's) instead
#: of the higher layer replacing the lower one's whole dict.
MERGED_FIELDS = frozenset({"manager_options", "reward_fn_kwargs"})


def _set_layered(values: dict[str, Any], key: str, value: Any) -> None:
    """Put a higher-precedence layer's ``value`` into ``values`` (:data:`MERGED_FIELDS` merge)."""
    values[key] = {**values.get(key, {}), **value} if key in MERGED_FIELDS else value


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    """The settable fields of a settings dataclass (internal bookkeeping fields left out)."""
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}


def build(cls: type, values: Mapping[str, Any]) -> Any:
    known = _fields(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown setting(s) {unknown}; known settings: {sorted(known)}")
    return cls(**values)


def _base_type(hint: Any) -> tuple[type, bool]:
    """``int | None`` -> ``(int, True)``; ``dict`` -> ``(dict, False)``."""
    args = typing.get_args(hint)
    if args:
        non_none = [a for a in args if a is not type(None)]
        base = typing.get_origin(non_none[0]) or non_none[0]
        return base, len(non_none) < len(args)
    return (typing.get_origin(hint) or hint), False


def _coerce(name: str, raw: str, f: dataclasses.Field, *, where: str | None = None) -> Any:
    """An environment string as the field's type (``where`` names the source in errors)."""
    typ, optional = _base_type(_hints().get(f.name, str))
    source = where or f"{ENV_PREFIX}{name.upper()}={raw!r}"
    try:
        if optional and raw.strip().lower() in ("", "none", "null"):
            return None
        if typ is bool:
            flag = parse_bool(raw) if raw.strip() else False
            if flag is None:
                raise ValueError("expected true/false, yes/no, on/off or 1/0")
            return flag
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        if typ is dict:
            value = json.loads(raw)
            if not isinstance(value, dict):
                raise ValueError("not a JSON object")
            return value
    except ValueError as exc:
        raise ConfigError(f"{source} is not a valid {typ.__name__} ({exc})") from None
    return raw


@functools.cache
def _hints() -> dict[str, Any]:
    """WorkerConfig's resolved type hints (``from __future__`` leaves them as strings)."""
    return typing.get_type_hints(WorkerConfig)


def check_value(name: str, value: Any, f: dataclasses.Field, where: str) -> Any:
    """A config-file value, type-checked like an environment variable: strings are parsed
    (``cluster: "false"`` is False), numbers must be numbers, ``bool`` is not an ``int``."""
    if isinstance(value, str):
        return _coerce(name, value, f, where=f"{where}: {name}={value!r}")
    typ, optional = _base_type(_hints().get(f.name, str))
    if value is None and optional:
        return None
    ok = (
        (typ is bool and isinstance(value, bool))
        or (typ is int and isinstance(value, int) and not isinstance(value, bool))
        or (typ is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (typ is dict and isinstance(value, Mapping))
    )
    if not ok:
        raise ConfigError(f"{where}: {name} must be a {typ.__name__}, got {type(value).__name__} {value!r:.80}")
    if typ is float:
        return float(value)
    return dict(value) if typ is dict else value


def from_env(env: Mapping[str, str], cls: type = WorkerConfig) -> dict[str, Any]:
    """The ``REWARDQ_*`` variables that name a field of ``cls``."""
    out = {}
    for name, f in _fields(cls).items():
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            out[name] = _coerce(name, raw, f)
    return out


@dataclass
class LoadedFile:
    """A config file's WorkerConfig values and the keys rewardq does not use (dotted paths)."""

    values: dict[str, Any]
    unused: list[str]
    origins: dict[str, str] = field(default_factory=dict)


def parse_file(path: str) -> dict[str, Any]:
    """The mapping a YAML/JSON config file holds (ConfigError when it is missing or malformed)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = p.read_text()
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        raise ConfigError(f"cannot parse config file {path}: {exc}") from None
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at top level")
    return data


def read_config_file(path: str) -> LoadedFile:
    """Read a rewardq config file, or verl's trainer config (see :mod:`rewardq.verl_config`).

    Precedence inside one file: what a verl config implies < top-level rewardq keys < a
    top-level ``rewardq:`` block < a ``reward.rewardq`` block. Every value is type-checked
    (:func:`check_value`); keys that are neither WorkerConfig fields nor verl's are listed in
    :attr:`LoadedFile.unused`, with a suggestion when one looks like a misspelt field.
    """
    from rewardq.verl_config import VERL_SECTIONS, is_verl_config, translate

    data = parse_file(path)
    known = _fields(WorkerConfig)
    layers: list[tuple[str, Mapping[str, Any]]] = []
    unused: list[str] = []
    origins: dict[str, str] = {}
    verl = is_verl_config(data)
    if verl:
        translated = translate(data)
        layers.append(("verl config", translated.values))
        unused += translated.unused
        origins = {k: f"{key} in {path}" for k, key in translated.origins.items()}
    top = {k: v for k, v in data.items() if not (verl and k in VERL_SECTIONS) and k != "rewardq"}
    layers.append(("", top))
    for block_path, block in (("rewardq", data.get("rewardq")), ("reward.rewardq", _reward_block(data))):
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise ConfigError(f"{path}: {block_path} must be a mapping of rewardq settings, got {block!r:.80}")
        layers.append((block_path, block))
    values: dict[str, Any] = {}
    for prefix, layer in layers:
        for key, value in layer.items():
            dotted = f"{prefix}.{key}" if prefix and prefix != "verl config" else str(key)
            if key in ADAPTER_KEYS:
                continue
            if key not in known:
                unused.append(dotted + _suggestion(str(key), known))
                continue
            where = f"{path} ({prefix})" if prefix else path
            _set_layered(values, key, check_value(key, value, known[key], where))
            if prefix != "verl config":
                origins.pop(key, None)
    return LoadedFile(values, unused, origins)


def _reward_block(data: Mapping[str, Any]) -> Any:
    reward = data.get("reward")
    return reward.get("rewardq") if isinstance(reward, Mapping) else None


def _suggestion(key: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if close else ""


def translate_verl_reward(reward: Mapping[str, Any]) -> dict[str, Any]:
    """Map a verl ``reward:`` block alone onto WorkerConfig fields (see :mod:`rewardq.verl_config`)."""
    from rewardq.verl_config import translate

    return translate({"reward": dict(reward)}).values
