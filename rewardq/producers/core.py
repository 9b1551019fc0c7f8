"""What the sync and async clients share: encoding, routing, result parsing, waiting state.

No I/O here; :mod:`rewardq.producers.client` and :mod:`rewardq.producers.aio` run the
commands these helpers describe.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from rewardq import defaults
from rewardq.errors import BackpressureTimeout, RecordError
from rewardq.queue.checks import CheckedDict, check_dict
from rewardq.queue.codec import encode_output
from rewardq.queue.keys import Keyspace, output_key, split_key
from rewardq.queue.results import RewardResult


class OutputLike(Protocol):
    """A verl ``AgentLoopOutput``, or any object with these attributes (a dict with these keys
    works too). Only ``prompt_ids`` and ``response_ids`` are required; ids may be lists, numpy
    arrays or torch tensors."""

    prompt_ids: Any
    response_ids: Any


#: One output as ``put_output`` takes it: a dict, or an object with the same attributes.
Output: TypeAlias = Mapping[str, Any] | OutputLike
#: A uid or session id: a string, or an int (verl's session ids), turned into its text.
Name: TypeAlias = str | int


@dataclass
class ClientSettings:
    """Producer-side settings.

    Attributes:
        namespace: the pipeline's namespace (must match the workers').
        shards: None reads the count from ``<ns>:meta`` (creating it with 1 if absent).
        max_record_bytes: refuse records larger than this (workers dead-letter them anyway).
        max_outputs: refuse output indices at or above this (workers reject them anyway); must
            not exceed the workers' ``max_outputs``.
        max_backlog: per shard; past it ``put_*`` waits for workers to catch up. None: no bound.
        backpressure_timeout: how long ``put_*`` waits before raising BackpressureTimeout.
        cluster: treat the URL as a Redis Cluster.
    """

    namespace: str = defaults.NAMESPACE
    shards: int | None = None
    max_record_bytes: int = defaults.MAX_RECORD_BYTES
    max_outputs: int = defaults.MAX_OUTPUTS
    max_backlog: int | None = defaults.MAX_BACKLOG
    backpressure_timeout: float = defaults.BACKPRESSURE_TIMEOUT
    cluster: bool = False


@dataclass
class Put:
    """One XADD: where, what."""

    shard: int
    key: str
    fields: dict[str, Any]


def prepare_output(
    ks: Keyspace,
    uid: Any,
    session_id: Any,
    index: Any,
    output: Any,
    sample: Any,
    *,
    final: bool,
    max_bytes: int,
    max_outputs: int = defaults.MAX_OUTPUTS,
) -> Put:
    data = encode_output(
        uid, session_id, index, output, sample, final=final, max_bytes=max_bytes, max_outputs=max_outputs
    )
    key = output_key(str(uid), str(session_id), int(index))
    shard = ks.shard_of(key.rpartition("_")[0])
    return Put(shard, key, {"key": key, "data": data, "ts": f"{time.time():.6f}"})


def prepare_trajectory(
    ks: Keyspace,
    uid: Any,
    session_id: Any,
    outputs: Sequence[Any],
    sample: Any,
    *,
    max_bytes: int,
    max_outputs: int = defaults.MAX_OUTPUTS,
) -> list[Put]:
    if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence) or isinstance(outputs, Mapping):
        raise RecordError("outputs", f"must be a list of outputs, got {type(outputs).__name__}")
    if len(outputs) == 0:
        raise RecordError("outputs", "a trajectory needs at least one output")
    n = len(outputs)
    if n > max_outputs:
        raise RecordError("outputs", f"has {n} outputs; a trajectory may have at most max_outputs={max_outputs}")
    sample = CheckedDict(check_dict(sample, "sample"))  # checked once, not once per output
    return [
        prepare_output(
            ks, uid, session_id, i, out, sample, final=(i == n - 1), max_bytes=max_bytes, max_outputs=max_outputs
        )
        for i, out in enumerate(outputs)
    ]


def parse_results(keys: Sequence[str], hashes: Iterable[Mapping[Any, Any]]) -> dict[str, RewardResult | None]:
    return {k: (RewardResult.from_hash(k, h) if h else None) for k, h in zip(keys, hashes)}


def check_keys(keys: Iterable[str]) -> list[str]:
    keys = [keys] if isinstance(keys, str) else list(keys)
    for k in keys:
        split_key(k)  # raises ValueError naming the bad key
    return keys


@dataclass
class Waiter:
    """Bookkeeping of one ``wait_rewards`` call."""

    keys: list[str]
    timeout: float
    deadline: float = 0.0
    results: dict[str, RewardResult] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout

    @property
    def missing(self) -> list[str]:
        return [k for k in self.keys if k not in self.results]

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def absorb(self, got: Mapping[str, RewardResult | None]) -> None:
        for k, r in got.items():
            if r is not None:
                self.results[k] = r

    def missing_for(self, tids: set[str]) -> list[str]:
        return [k for k in self.missing if k.rpartition("_")[0] in tids]

    def ordered(self) -> dict[str, RewardResult]:
        return {k: self.results[k] for k in self.keys}


def settings_from_kwargs(namespace: str, kwargs: dict[str, Any]) -> ClientSettings:
    """Split ``from_url`` keyword arguments: ClientSettings fields are taken out of ``kwargs``
    (what is left goes to the Redis connection)."""
    settings = ClientSettings(namespace=namespace, cluster=bool(kwargs.pop("cluster", False)))
    for k in list(kwargs):
        if hasattr(settings, k):
            setattr(settings, k, kwargs.pop(k))
    return settings


class ClientBase:
    """State the sync and async clients share: the Redis client, settings, backlog gate."""

    def __init__(self, redis: Any, settings: ClientSettings | None = None, **overrides: Any) -> None:
        from rewardq.queue.connection import is_cluster_client

        self.r = redis
        s = settings or ClientSettings()
        for k, v in overrides.items():
            setattr(s, k, v)
        self.settings = s
        self.cluster = is_cluster_client(redis)
        self._ks: Keyspace | None = None
        self._backlog = Backlog(s.max_backlog, s.backpressure_timeout)

    def _prepare_output(
        self, ks: Keyspace, uid: Any, session_id: Any, index: Any, output: Any, sample: Any, final: bool
    ) -> Put:
        s = self.settings
        return prepare_output(
            ks,
            uid,
            session_id,
            index,
            output,
            sample,
            final=final,
            max_bytes=s.max_record_bytes,
            max_outputs=s.max_outputs,
        )

    def _prepare_trajectory(
        self, ks: Keyspace, uid: Any, session_id: Any, outputs: Sequence[Any], sample: Any
    ) -> list[Put]:
        s = self.settings
        return prepare_trajectory(
            ks, uid, session_id, outputs, sample, max_bytes=s.max_record_bytes, max_outputs=s.max_outputs
        )

    def _send_pipeline(self, ks: Keyspace, puts: list[Put]) -> tuple[Any, list[int]]:
        """A pipeline holding one XADD per put, then one XLEN per shard touched; returns it and
        those shards (the order of the XLEN replies after the ``len(puts)`` XADD replies).

        One Redis, one shard: MULTI/EXEC, so a worker blocked in XREADGROUP wakes once with every
        output instead of after the first XADD (one read + store round trip less).
        """
        shards = sorted({p.shard for p in puts})
        pipe = self.r.pipeline(transaction=not self.cluster and len(shards) == 1)
        for p in puts:
            pipe.xadd(ks.stream(p.shard), p.fields)
        for shard in shards:
            pipe.xlen(ks.stream(shard))
        return pipe, shards

    def _reward_pipeline(self, ks: Keyspace, keys: list[str]) -> Any:
        """A pipeline holding one HGETALL per key's reward hash (parse the replies with parse_results)."""
        pipe = self.r.pipeline(transaction=False)
        for k in keys:
            pipe.hgetall(ks.reward_key(k))
        return pipe

    def _keyspace_from_meta(self, have: Any) -> Keyspace:
        """The keyspace for the shard count ``<ns>:meta`` holds; refuses a mismatch."""
        from rewardq.errors import ConfigError

        have = int(have)
        if self.settings.shards is not None and have != self.settings.shards:
            raise ConfigError(f"namespace {self.settings.namespace!r} uses shards={have}, not {self.settings.shards}")
        self._ks = Keyspace(self.settings.namespace, have)
        return self._ks


def finished_tids(ks: Keyspace, resp: Any, last: dict[int, bytes]) -> list[str]:
    """The trajectory ids in an XREAD reply over ``done`` streams; advances ``last`` (shard -> id)."""
    index = {ks.done(s).encode(): s for s in last}
    tids = []
    items = resp.items() if isinstance(resp, dict) else (resp or [])
    for name, entries in items:
        if entries and isinstance(entries[0], list) and len(entries) == 1 and isinstance(entries[0][0], (list, tuple)):
            entries = entries[0]  # RESP3 map shape
        s = index[name if isinstance(name, bytes) else name.encode()]
        for eid, fields in entries:
            last[s] = eid
            tid = fields.get(b"tid")
            if tid is not None:
                tids.append(tid.decode())
    return tids


class Backlog:
    """Per-shard backlog gate: after each XADD we learn the stream length for free."""

    def __init__(self, max_backlog: int | None, timeout: float) -> None:
        self.max_backlog = max_backlog
        self.timeout = timeout
        self.full: set[int] = set()

    def note(self, shard: int, length: int) -> None:
        if self.max_backlog is not None and length >= self.max_backlog:
            self.full.add(shard)
        else:
            self.full.discard(shard)

    def note_all(self, shards: Sequence[int], lengths: Iterable[Any]) -> None:
        for shard, length in zip(shards, lengths):
            self.note(shard, int(length))

    def waiting(self, shard: int) -> BacklogWait:
        """Start waiting for a full ``shard`` to drain (see :class:`BacklogWait`)."""
        return BacklogWait(self, shard)

    def error(self, shard: int, length: int) -> BackpressureTimeout:
        return BackpressureTimeout(
            f"shard {shard} still holds {length} unprocessed entries (max_backlog={self.max_backlog}) after "
            f"waiting {self.timeout:g}s; start more workers (`rewardq worker`), check them with "
            "`rewardq status`, or raise max_backlog"
        )


class BacklogWait:
    """One wait for a full shard to drain: the caller polls XLEN and sleeps as :meth:`after` says,
    0.01 s doubling up to 0.5 s, for at most the backlog's timeout."""

    def __init__(self, backlog: Backlog, shard: int) -> None:
        self.backlog = backlog
        self.shard = shard
        self.deadline = time.monotonic() + backlog.timeout
        self.delay = 0.01

    def after(self, length: int) -> float | None:
        """Note the shard's ``length``: None once it has room, else the seconds to sleep before the
        next poll. Raises BackpressureTimeout once the wait has lasted the timeout."""
        self.backlog.note(self.shard, length)
        if self.shard not in self.backlog.full:
            return None
        if time.monotonic() >= self.deadline:
            raise self.backlog.error(self.shard, length)
        delay, self.delay = self.delay, min(self.delay * 2, 0.5)
        return delay
