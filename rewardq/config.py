"""rewardq's settings: each declared once, in :class:`WorkerConfig` (and
:class:`~rewardq.adapter_settings.AdapterSettings`, the verl adapter's, which shares the worker's
declarations of where Redis is).

Precedence (lowest to highest): defaults < config file (``--config``) < environment
(``REWARDQ_<NAME>``, e.g. ``REWARDQ_REDIS_URL``) < command-line flags (``--<name>``).

Each field is one :func:`~rewardq.settings.setting` declaration: type, default, help text and
bounds. The environment variable, the config-file key, the ``rewardq worker`` flag with its
``--help`` line, the checks and ``rewardq config``'s "where did this come from" are all derived
from it (:mod:`rewardq.settings`, :mod:`rewardq.ops.flags`), so adding a setting is one
declaration here::

    drain_grace: float = setting(10.0, "Seconds a draining worker waits.", above=0)

gives ``--drain-grace`` (with ``[default: ...; env: REWARDQ_DRAIN_GRACE]`` in ``--help``), the
variable, the file key ``drain_grace``, the check, and a row of ``rewardq config``. The default
lives in the declaration; code elsewhere that needs it reads it from there
(``WorkerConfig.drain_grace``). A default that code below this module needs (``queue/``,
``reward/``, the producers) lives beside that code and the declaration names it
(``setting(MAX_OUTPUTS, ...)``); ``tests/unit/test_defaults.py`` checks that no two places
disagree. ``choices=``, ``minimum=``/``above=``/``maximum=``, ``shown_default=`` (for a
None that means something) and ``passed_to="broker"`` (a keyword argument of the same name of
:class:`~rewardq.queue.broker.StreamBroker`) say the rest; see :func:`rewardq.settings.setting`.

A config file is YAML (or JSON) holding our own keys at top level, or verl's whole trainer
config, or both (:mod:`rewardq.config_file` reads it). File values are type-checked as
environment variables are (``cluster: "false"`` is False, a word where a number belongs is an
error naming the file and key). Keys rewardq does not use are collected in
``WorkerConfig.unused_keys`` and listed once when the worker starts; they never stop it.

This module is one table and the two doors of it (``validate``, ``load``), kept whole so that every
setting reads in one place; a declaration's help is its documentation, and a ``#:`` comment above it
only says what the help has no room for. The verl adapter's settings are a table of their own
(:mod:`rewardq.adapter_settings`, which imports this module for the three declarations it shares);
the worker's file reader skips their keys (:data:`ADAPTER_KEYS`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rewardq.config_file import read_config_file, read_url_file
from rewardq.errors import ConfigError
from rewardq.queue.broker import INCOMPLETE_TIMEOUT, KEEP_RECORDS, LEASE_SECONDS
from rewardq.queue.checks import MAX_OUTPUTS, MAX_RECORD_BYTES, MAX_TRAJECTORY_BYTES
from rewardq.queue.connection import REDIS_URL
from rewardq.queue.images import MAX_IMAGE_BYTES
from rewardq.queue.keys import DEAD_LETTER_BYTES, DEAD_LETTER_TTL, GROUP, NAMESPACE
from rewardq.queue.results import MAX_RESULT_BYTES, RESULT_TTL
from rewardq.reward.execution.settings import REWARD_FN_PLACEMENT, REWARD_FN_PLACEMENTS, SCORER_PROCESSES, SCORER_SPARES
from rewardq.settings import (
    ENV_PREFIX,
    FALSE_WORDS,
    TRUE_WORDS,
    Layers,
    Setting,
    check_bounds,
    choice_of,
    env_values,
    parse_bool,
    setting,
    settings_of,
)

__all__ = [
    "ENV_PREFIX",
    "TRUE_WORDS",
    "FALSE_WORDS",
    "parse_bool",
    "WorkerConfig",
    "ADAPTER_KEYS",
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
    redis_url: str = setting(REDIS_URL, "redis://[user:pass@]host:port/db, rediss://, redis+cluster://.")
    redis_url_file: str | None = setting(
        None,
        "A file whose first line is the Redis URL, which then replaces redis_url from any layer but "
        "--redis-url: keeps the password off command lines and environments.",
        metavar="PATH",
    )
    cluster: bool = setting(False, "Treat --redis-url as a Redis Cluster.")
    namespace: str = setting(NAMESPACE, "First component of every key; producers must use the same.")
    group: str = setting(GROUP, "Consumer group the workers of one pipeline share.")
    shards: int | None = setting(
        None, "Stream shards (must match the namespace's).", above=0, shown_default="the namespace's (1 if new)"
    )
    name: str | None = setting(None, "Consumer name of this worker.", shown_default="<host>-<pid>-<random>")
    # what
    #: The reward manager a worker runs unless told otherwise (verl's default).
    manager: str = setting("naive", "Reward manager.", more_help=_manager_names)
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
        REWARD_FN_PLACEMENT,
        "Where a sync --reward-fn runs: scorer processes, threads, or inline (trusted, cheap code only).",
        choices=REWARD_FN_PLACEMENTS,
    )
    #: Whether a worker whose scoring configuration differs from the one its namespace records takes the
    #: namespace over (a rolling upgrade: it waits until no live worker runs the recorded one, then
    #: records its own) instead of refusing to start.
    takeover: bool = setting(
        False,
        "Rolling upgrade: when the namespace records another scoring configuration, wait until no live "
        "worker runs it, then record this one (without it such a worker refuses to start).",
    )
    scorer_processes: int | None = setting(
        SCORER_PROCESSES, "Scorer processes per function.", above=0, shown_default="one per core, at least 2"
    )
    scorer_spares: int = setting(
        SCORER_SPARES, "Spare scorer processes at most, for calls waiting behind stuck ones.", minimum=0
    )
    # how much
    concurrency: int = setting(32, "Trajectories scored at once by one worker.", above=0)
    #: Trajectories a worker holds waiting for a scoring slot, as a multiple of ``concurrency``
    #: (rewardq.consumers.inflight): enough that a slot that frees starts the next trajectory without a
    #: read in between, few enough that a fleet started on a backlog shares it instead of the first
    #: worker to read taking all of it.
    read_ahead: float = setting(
        1.0,
        "Trajectories a worker holds waiting for a scoring slot, as a multiple of --concurrency (rounded "
        "up): it reads no more while that many wait; a dead worker's reclaimed trajectories may add one "
        "worker's worth (concurrency x (1 + read_ahead)).",
        minimum=0,
    )
    batch_size: int = setting(
        256, "Most stream entries per read (a read asks for no more than the worker has room for).", above=0
    )
    #: Milliseconds one XREADGROUP blocks waiting for entries.
    block_ms: int = setting(1000, "Longest blocking read, in milliseconds (0: do not block).", minimum=0)
    #: Seconds one trajectory's ``run_single`` may take before it is an error result.
    score_timeout: float = setting(300.0, "Seconds one trajectory's scoring may take.", above=0)
    #: Seconds a trajectory whose scoring failed for a ``transient`` reason (a judge answering 503,
    #: SandboxFusion down) keeps being scored again, counted from its first such failure, before it
    #: becomes an error result of kind ``transient``: long enough to ride out a judge or sandbox restart.
    retry_for: float = setting(
        300.0,
        "Seconds a trajectory whose scoring failed for a transient reason (a judge answering 429/5xx, "
        "SandboxFusion down, a lost connection) is scored again, after backoffs honouring Retry-After, "
        "before it becomes an error result of kind transient (0: never retried).",
        minimum=0,
    )
    #: Seconds one write of results waits for room in a Redis past ``maxmemory`` before its keys get an
    #: error result of kind ``memory`` instead (rewardq.consumers.retries.RoomWaits): results that never
    #: fit (larger than the cap, or a Redis nobody drains) must not wait for ever.
    room_wait: float = setting(
        300.0,
        "Seconds one write of a trajectory's results waits for room in a Redis past its maxmemory before "
        "its keys get an error result of kind memory naming the results' size and Redis's maxmemory.",
        above=0,
    )
    # recovery
    claim_idle: float = setting(60.0, "Seconds an entry stays pending before another worker reclaims it.", above=0)
    #: Deliveries of one entry (its first read, then each reclaim or hand-back) before its trajectory is
    #: dead-lettered with an error result for every key, naming what became of the earlier attempts.
    max_deliveries: int = setting(
        5,
        "Deliveries before an entry is dead-lettered (not counting those spent scoring its trajectory in "
        "cohorts of suspects after worker deaths: at most log2 of a worker's slots).",
        above=0,
    )
    #: Times a trajectory may take its worker process down while scored alone before it gets an
    #: error result (a crash while scored alone can only be its own doing).
    max_crashes: int = setting(
        2,
        "Worker deaths while a trajectory is scored alone before it gets an error result.",
        above=0,
    )
    lease_seconds: float = setting(
        LEASE_SECONDS,
        "Seconds a trajectory stays leased to its worker without renewal.",
        above=0,
        passed_to="broker",
    )
    heartbeat_interval: float = setting(2.0, "Seconds between heartbeats (and lease renewals).", above=0)
    maintenance_interval: float = setting(
        5.0,
        "Seconds between maintenance passes (reclaim, expiry of incomplete trajectories).",
        above=0,
    )
    incomplete_timeout: float = setting(
        INCOMPLETE_TIMEOUT,
        "Seconds a trajectory may wait for missing outputs before every key gets an error.",
        above=0,
        passed_to="broker",
    )
    result_ttl: float = setting(RESULT_TTL, "Seconds results are kept (0: forever).", minimum=0, passed_to="broker")
    keep_records: float = setting(
        KEEP_RECORDS,
        "Seconds an ended trajectory's outputs (scored or failed) stay for `rewardq inspect` and "
        "`rewardq dead-letters retry` (0: deleted once its result is written).",
        minimum=0,
        passed_to="broker",
    )
    dead_letter_bytes: int = setting(
        DEAD_LETTER_BYTES,
        "Bytes each shard's dead-letter stream keeps at most; the oldest dead letters go first "
        "(a dead letter keeps a record whole up to 1 MiB, else its first 64 KiB).",
        above=0,
        passed_to="broker",
    )
    dead_letter_ttl: float = setting(
        DEAD_LETTER_TTL,
        "Seconds a dead letter is kept.",
        above=0,
        passed_to="broker",
    )
    shutdown_grace: float = setting(
        30.0,
        "Seconds a stopping worker lets in-flight scoring finish before handing it back.",
        above=0,
    )
    max_record_bytes: int = setting(
        MAX_RECORD_BYTES, "Largest record, in bytes; larger ones are dead-lettered.", above=0, passed_to="broker"
    )
    max_image_bytes: int = setting(
        MAX_IMAGE_BYTES,
        "Largest encoded image (PNG/JPEG/WebP) in a record's multi_modal_data, in bytes; larger ones are "
        "dead-lettered (producers refuse them naming the output and the image).",
        above=0,
    )
    max_trajectory_bytes: int = setting(
        MAX_TRAJECTORY_BYTES,
        "Largest total of one trajectory's records, in bytes; past it every key gets an error result.",
        above=0,
        passed_to="broker",
    )
    #: Largest padded batch (the ``TensorDict`` one trajectory's manager receives), in bytes, computed
    #: from the outputs' lengths before anything is allocated. Padding multiplies: 4,096 outputs padded
    #: to one 8M-token response would take ~1 TB. 1 GiB holds a batch of 64 outputs of 128k-token
    #: prompts and 128k-token responses; a larger one is refused with an error result naming it.
    max_batch_bytes: int = setting(
        1024 * 1024 * 1024,
        "Largest padded batch of one trajectory, in bytes, checked before it is built; past it every key "
        "gets an error result.",
        above=0,
    )
    #: Largest ``max_result_bytes`` a worker accepts: Redis refuses a string over 512 MiB (``proto-max-bulk-len``).
    max_result_bytes: int = setting(
        MAX_RESULT_BYTES,
        "Largest stored result of one key, reward_extra_info included, in bytes; a larger one becomes an "
        "error result naming it.",
        minimum=1,
        maximum=512 * 1024 * 1024,
        bound_why="Redis refuses a string over 512 MiB",
        passed_to="broker",
    )
    #: Largest ``max_outputs`` a worker accepts: every Lua script's worst-case run time grows with it.
    max_outputs: int = setting(
        MAX_OUTPUTS,
        "Outputs one trajectory may have; bounds every Lua script's work.",
        minimum=1,
        maximum=1_000_000,
        bound_why="every Lua script's worst-case run time grows with it; the default 4096 keeps each under ~50 ms",
        passed_to="broker",
    )
    #: Seconds ``rewardq worker`` waits for Redis at start-up; None waits forever (a supervisor or
    #: k8s restarts workers while Redis is still coming up).
    connect_timeout: float | None = setting(
        None,
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
    #: Seconds a worker's ledger spool segment collects trajectories before it is written as one Parquet
    #: file (rewardq.ledger): fewer, larger files against fresher ledgers. At 60 s a 1,000-GPU run with
    #: 100 workers makes ~144,000 files a day, 6,000 an hour.
    ledger_flush_interval: float = setting(
        60.0, "Seconds the spool collects before it is written as one Parquet file.", above=0
    )
    #: Bytes of spool after which a segment is written early, whatever its age (one Parquet file each).
    ledger_file_bytes: int = setting(
        128 * 1024 * 1024, "Spooled bytes after which a Parquet file is written early.", above=0
    )
    #: Spooled bytes not yet written (the ledger's destination refusing files) past which a worker stops
    #: spooling and counts trajectories as unwritten, rather than fill its disk.
    ledger_spool_max_bytes: int = setting(
        10 * 1024**3,
        "Spooled bytes not yet written (the ledger refusing files) past which trajectories are counted as "
        "unwritten instead of spooled.",
        above=0,
    )
    # observability
    metrics_port: int | None = setting(
        None, "Serve Prometheus metrics on this port (0: any free port).", minimum=0, shown_default="off"
    )
    #: Worker log level, and log format (``text`` or ``json``: one object per line).
    log_level: str = setting("INFO", "Log level.", choices=LOG_LEVELS, ignore_case=True)
    log_format: str = setting("text", "text, or one JSON object per line.", choices=("text", "json"))
    log_summary_interval: float = setting(
        30.0,
        "Seconds between the INFO lines summing up the trajectories that ended (by outcome, rate, mean "
        "time); each trajectory's own line is DEBUG (0: no summary lines).",
        minimum=0,
    )
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
        overrides: Mapping[str, object] | None = None,
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
            loaded = read_config_file(config_file, cls.settings(), ADAPTER_KEYS)
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
        cfg.sources.update({k: v for k, v in layers.sources.items() if k not in known})  # a merged dict's keys
        cfg.unused_keys = unused
        cfg.config_file = config_file
        if cfg.redis_url_file and not cfg.sources["redis_url"].startswith("flag"):
            cfg.redis_url = read_url_file(cfg.redis_url_file)
            cfg.sources["redis_url"] = f"redis_url_file {cfg.redis_url_file}"
        return cfg.validate()


#: Settings only the verl adapter reads (:class:`rewardq.adapter_settings.AdapterSettings`'s keys
#: beyond the worker's, which ``tests/unit/test_settings.py`` checks against its declarations, and
#: ``fleet``: the Ray fleet the adapter starts, rewardq.integrations.verl.fleet); workers accept them
#: in a shared config file without listing them as unused. Written out here because that module
#: imports this one.
ADAPTER_KEYS = frozenset({"verl_timeout", "verl_on_error", "verl_max_error_rate", "verl_error_window", "fleet"})
