"""Worker and client settings: one dataclass, with environment, file and CLI as thin doors.

Precedence (lowest to highest): defaults < config file (``--config``) < environment
(``REWARDQ_<FIELD>``, e.g. ``REWARDQ_REDIS_URL``) < command-line flags.

A config file is YAML (or JSON) holding either our own fields at top level, or a
verl-style ``reward:`` block (``reward_manager.name``, ``custom_reward_function.path/name/
reward_kwargs``, ``reward_kwargs.overlong_buffer_cfg``, ``reward_kwargs.max_resp_len``,
``max_concurrent``, ``max_rpm``, ``max_tpm``, ``timeout``, ``num_workers``, ...), so a team can
point rewardq at the config it already has.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewardq import defaults
from rewardq.errors import ConfigError

ENV_PREFIX = "REWARDQ_"


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
    concurrency: int = 32  # trajectories scored at once by one worker
    batch_size: int = 256  # entries per XREADGROUP
    block_ms: int = 1000
    score_timeout: float = 300.0  # one trajectory's run_single, seconds
    # recovery
    claim_idle: float = 60.0  # seconds before another worker reclaims a pending entry
    max_deliveries: int = 5  # deliveries before an entry is dead-lettered
    max_crashes: int = defaults.MAX_CRASHES  # worker deaths while a trajectory is scored alone
    lease_seconds: float = 30.0
    heartbeat_interval: float = 2.0
    maintenance_interval: float = 5.0
    incomplete_timeout: float = 600.0  # seconds a trajectory may wait for missing outputs
    result_ttl: float = 7 * 86400.0  # 0 keeps results forever
    keep_records: float = 0.0  # seconds to keep a scored trajectory's outputs for `rewardq inspect`
    shutdown_grace: float = 30.0
    max_record_bytes: int = defaults.MAX_RECORD_BYTES
    # observability
    metrics_port: int | None = None
    log_level: str = "INFO"
    log_format: str = "text"  # text | json

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
            "shards",
            "scorer_processes",
        ):
            positive(n)
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
        """Defaults, then ``config_file``, then environment, then ``overrides`` (CLI flags)."""
        values: dict[str, Any] = {}
        if config_file:
            values.update(read_config_file(config_file))
        values.update(from_env(os.environ if env is None else env))
        for k, v in (overrides or {}).items():
            if v is None:
                continue
            if k in ("manager_options", "reward_fn_kwargs"):
                values[k] = {**values.get(k, {}), **v}
            else:
                values[k] = v
        return build(cls, values).validate()


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def build(cls: type, values: Mapping[str, Any]) -> Any:
    known = _fields(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown setting(s) {unknown}; known settings: {sorted(known)}")
    return cls(**values)


def _coerce(name: str, raw: str, f: dataclasses.Field) -> Any:
    typ = str(f.type)
    try:
        if typ.startswith("bool"):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if typ.startswith("int"):
            return None if raw == "" and "None" in typ else int(raw)
        if typ.startswith("float"):
            return float(raw)
        if typ.startswith("dict"):
            value = json.loads(raw)
            if not isinstance(value, dict):
                raise ValueError("not a JSON object")
            return value
    except ValueError as exc:
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {typ} ({exc})") from None
    return None if raw == "" and "None" in typ else raw


def from_env(env: Mapping[str, str], cls: type = WorkerConfig) -> dict[str, Any]:
    """The ``REWARDQ_*`` variables that name a field of ``cls``."""
    out = {}
    for name, f in _fields(cls).items():
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            out[name] = _coerce(name, raw, f)
    return out


def read_config_file(path: str) -> dict[str, Any]:
    """Read our YAML/JSON config, or translate a verl ``reward:`` block."""
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
    if "reward" in data and isinstance(data["reward"], dict):
        ours = {k: v for k, v in data.items() if k != "reward"}
        ours.pop("rewardq", None)
        merged = translate_verl_reward(data["reward"])
        merged.update(data.get("rewardq") or {})
        return merged
    return data


def translate_verl_reward(reward: Mapping[str, Any]) -> dict[str, Any]:
    """Map a verl ``reward:`` config block onto WorkerConfig fields."""
    out: dict[str, Any] = {}
    opts: dict[str, Any] = {}
    rm = reward.get("reward_manager")
    name = rm.get("name") if isinstance(rm, Mapping) else rm
    if name:
        out["manager"] = str(name)
    crf = reward.get("custom_reward_function") or {}
    if crf.get("path"):
        fn = crf.get("name") or "compute_score"
        out["reward_fn"] = f"{crf['path']}:{fn}"
        if crf.get("reward_kwargs"):
            out["reward_fn_kwargs"] = dict(crf["reward_kwargs"])
    rk = reward.get("reward_kwargs") or {}
    if rk.get("overlong_buffer_cfg") is not None:
        opts["overlong_buffer"] = dict(rk["overlong_buffer_cfg"])
    if rk.get("max_resp_len") is not None:
        opts["max_resp_len"] = int(rk["max_resp_len"])
    for k in (
        "max_concurrent",
        "max_rpm",
        "max_tpm",
        "estimated_tokens_per_request",
        "timeout",
        "num_workers",
        "experiment_name",
    ):
        v = reward.get(k, rk.get(k))
        if v is not None:
            opts[k] = v
    rmodel = reward.get("reward_model") or {}
    if isinstance(rmodel, Mapping) and rmodel.get("enable"):
        out["manager"] = "disrm"
        for k in ("base_url", "model", "backend", "tokenizer"):
            if rmodel.get(k) is not None:
                opts[k] = rmodel[k]
    if opts:
        out["manager_options"] = opts
    return out
