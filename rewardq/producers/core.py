"""What the sync and async clients share: encoding, routing, result parsing, waiting state.

No I/O here; :mod:`rewardq.producers.client` and :mod:`rewardq.producers.aio` run the
commands these helpers describe.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar, cast

from rewardq import defaults
from rewardq.errors import BackpressureTimeout, RecordError, RewardqError
from rewardq.queue.checks import CheckedDict, check_dict, check_trajectory_bytes
from rewardq.queue.codec import encode_output
from rewardq.queue.connection import client_user
from rewardq.queue.keys import Keyspace, output_key, split_key
from rewardq.queue.put_errors import put_error
from rewardq.queue.results import RewardResult

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis, Encodable, SyncRedis

#: The Redis client a producer client holds: blocking (RewardClient) or asyncio (AsyncRewardClient).
R = TypeVar("R", bound="SyncRedis | AsyncRedis")


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
        max_image_bytes: refuse an image larger than this, naming the output and the image (workers
            dead-letter it anyway); must not exceed the workers' ``max_image_bytes``.
        max_trajectory_bytes: ``put_trajectory`` refuses a trajectory whose records total more than
            this, before anything is written (workers fail such a trajectory anyway).
        max_outputs: refuse output indices at or above this (workers reject them anyway); must
            not exceed the workers' ``max_outputs``.
        max_backlog: per shard; past it ``put_*`` waits for workers to catch up. None: no bound.
        backpressure_timeout: how long ``put_*`` waits before raising BackpressureTimeout.
        cluster: treat the URL as a Redis Cluster.
        tokenizer: the fingerprint of the tokenizer that made the ids
            (:func:`rewardq.reward.fingerprint.tokenizer_fingerprint`), sent with every record so a
            worker decoding with another vocabulary answers with an error instead of a wrong reward.
    """

    namespace: str = defaults.NAMESPACE
    shards: int | None = None
    max_record_bytes: int = defaults.MAX_RECORD_BYTES
    max_trajectory_bytes: int = defaults.MAX_TRAJECTORY_BYTES
    max_outputs: int = defaults.MAX_OUTPUTS
    max_image_bytes: int = defaults.MAX_IMAGE_BYTES
    max_backlog: int | None = defaults.MAX_BACKLOG
    backpressure_timeout: float = defaults.BACKPRESSURE_TIMEOUT
    cluster: bool = False
    tokenizer: str | None = None


@dataclass
class Put:
    """One XADD: where, what."""

    shard: int
    key: str
    fields: dict[Encodable, Encodable]

    @property
    def size(self) -> int:
        return len(cast(bytes, self.fields["data"]))  # the encoded record prepare_output put there


def _bytes_text(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


@dataclass
class PutCall:
    """One ``put_*`` call, for the error it may end in: what it puts, and whether it wrote anything
    (False until its commands are sent; then unknown until Redis answers)."""

    name: str
    uid: object
    session_id: object
    client: ClientBase[Any] | None = None
    puts: list[Put] = field(default_factory=list)
    written: bool | None = False

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.puts]

    def what(self) -> str:
        if not self.puts:
            return f"{self.name} for uid {str(self.uid)[:80]!r}"
        size = _bytes_text(sum(p.size for p in self.puts))
        if len(self.puts) == 1:
            return f"{self.name} of {self.puts[0].key[:200]} ({size})"
        tid = self.puts[0].key.rpartition("_")[0]
        return f"{self.name} of {len(self.puts)} outputs of {tid[:200]} ({size})"

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Inside, a Redis failure raises :func:`~rewardq.queue.put_errors.put_error`'s PutError."""
        try:
            yield
        except RewardqError:
            raise
        except Exception as exc:
            namespace, user = "", "default"
            if self.client is not None:
                namespace, user = self.client.settings.namespace, client_user(self.client.r)
            err = put_error(exc, self.what(), self.keys, written=self.written, namespace=namespace, user=user)
            if err is None:
                raise
            raise err from None


def split_replies(puts: Sequence[Put], replies: Sequence[Any]) -> tuple[BaseException | None, dict[int, list[Any]]]:
    """The first error among the XADD replies of a non-transactional pipeline, and the entry ids
    each shard's stream did add (what a rollback deletes again)."""
    failure: BaseException | None = None
    added: dict[int, list[Any]] = {}
    for p, reply in zip(puts, replies):
        if isinstance(reply, BaseException):
            failure = failure or reply
        else:
            added.setdefault(p.shard, []).append(reply)
    return failure, added


def backlog_lengths(replies: Sequence[Any]) -> list[int]:
    """The XLEN replies of a put's pipeline as lengths (an error counts as empty)."""
    return [0 if isinstance(r, BaseException) else int(r) for r in replies]


def prepare_output(
    ks: Keyspace,
    uid: Any,
    session_id: Any,
    index: Any,
    output: object,
    sample: Any,
    *,
    final: bool,
    max_bytes: int,
    max_outputs: int = defaults.MAX_OUTPUTS,
    max_image_bytes: int = defaults.MAX_IMAGE_BYTES,
    tokenizer: str | None = None,
) -> Put:
    data = encode_output(
        uid,
        session_id,
        index,
        output,
        sample,
        final=final,
        max_bytes=max_bytes,
        max_outputs=max_outputs,
        max_image_bytes=max_image_bytes,
        tokenizer=tokenizer,
    )
    key = output_key(str(uid), str(session_id), int(index))
    shard = ks.shard_of(key.rpartition("_")[0])
    return Put(shard, key, {"key": key, "data": data, "ts": f"{time.time():.6f}"})


def prepare_trajectory(
    ks: Keyspace,
    uid: object,
    session_id: object,
    outputs: Sequence[Any],
    sample: object,
    *,
    max_bytes: int,
    max_outputs: int = defaults.MAX_OUTPUTS,
    max_image_bytes: int = defaults.MAX_IMAGE_BYTES,
    max_trajectory_bytes: int = defaults.MAX_TRAJECTORY_BYTES,
    tokenizer: str | None = None,
) -> list[Put]:
    """The puts of a whole trajectory; raises RecordError for a bad output, and
    :class:`~rewardq.errors.TrajectoryTooLarge` as soon as the records encoded so far pass
    ``max_trajectory_bytes`` (the rest are not encoded), before anything is written."""
    if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence) or isinstance(outputs, Mapping):
        raise RecordError("outputs", f"must be a list of outputs, got {type(outputs).__name__}")
    if len(outputs) == 0:
        raise RecordError("outputs", "a trajectory needs at least one output")
    n = len(outputs)
    if n > max_outputs:
        raise RecordError("outputs", f"has {n} outputs; a trajectory may have at most max_outputs={max_outputs}")
    sample = CheckedDict(check_dict(sample, "sample"))  # checked once, not once per output
    puts: list[Put] = []
    total = 0
    for i, out in enumerate(outputs):
        put = prepare_output(
            ks,
            uid,
            session_id,
            i,
            out,
            sample,
            final=(i == n - 1),
            max_bytes=max_bytes,
            max_outputs=max_outputs,
            max_image_bytes=max_image_bytes,
            tokenizer=tokenizer,
        )
        total += put.size
        check_trajectory_bytes(total, max_trajectory_bytes, n, counted=i + 1)
        puts.append(put)
    return puts


def parse_results(keys: Sequence[str], hashes: Iterable[Mapping[Any, Any]]) -> dict[str, RewardResult | None]:
    return {k: (RewardResult.from_hash(k, h) if h else None) for k, h in zip(keys, hashes)}


class ReadPlan:
    """The keys of one read of results, in round trips that each bring back about ``budget`` bytes.

    One pipeline of HGETALLs is answered by Redis in one go, other clients waiting meanwhile: 300
    results of 900 KB read at once held every other client for ~0.4 s. So a read starts with
    :data:`FIRST` keys and sizes each next round trip from the results seen so far (up to
    :data:`MOST` keys): thousands of small results still come in a few round trips, large ones
    about ``budget`` bytes at a time.
    """

    FIRST = 16
    MOST = 1024
    BUDGET = 8 * 1024 * 1024

    def __init__(self, keys: Sequence[str], budget: int = BUDGET) -> None:
        self.keys = list(keys)
        self.budget = budget
        self.next = self.FIRST
        self.read = 0
        self.bytes = 0

    def __iter__(self) -> Iterator[list[str]]:
        start = 0
        while start < len(self.keys):
            chunk = self.keys[start : start + self.next]
            start += len(chunk)
            yield chunk

    def took(self, hashes: Sequence[Mapping[Any, Any]]) -> None:
        """Note what a round trip brought back, to size the next one."""
        self.read += len(hashes)
        self.bytes += sum(len(k) + len(v) for h in hashes if h for k, v in h.items())
        per_key = max(1, self.bytes // max(1, self.read))
        self.next = max(1, min(self.MOST, self.budget // per_key))


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


class ClientBase(Generic[R]):
    """State the sync and async clients share: the Redis client, settings, backlog gate."""

    def __init__(self, redis: R, settings: ClientSettings | None = None, **overrides: Any) -> None:
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
        self, ks: Keyspace, uid: object, session_id: object, index: object, output: object, sample: object, final: bool
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
            max_image_bytes=s.max_image_bytes,
            tokenizer=s.tokenizer,
        )

    def _prepare_trajectory(
        self, ks: Keyspace, uid: object, session_id: object, outputs: Sequence[Any], sample: object
    ) -> list[Put]:
        s = self.settings
        return prepare_trajectory(
            ks,
            uid,
            session_id,
            outputs,
            sample,
            max_bytes=s.max_record_bytes,
            max_outputs=s.max_outputs,
            max_image_bytes=s.max_image_bytes,
            max_trajectory_bytes=s.max_trajectory_bytes,
            tokenizer=s.tokenizer,
        )

    def _send_pipeline(self, ks: Keyspace, puts: list[Put]) -> tuple[Any, list[int], bool]:
        """A pipeline holding one XADD per put, then one XLEN per shard touched; returns it, those
        shards (the order of the XLEN replies after the ``len(puts)`` XADD replies) and whether it is
        a transaction.

        The puts of one call all go to one shard (a trajectory's). On one Redis they go in MULTI/EXEC:
        all or nothing (a refused XADD discards them all), and a worker blocked in XREADGROUP wakes once
        with every output instead of after the first. redis-py's cluster client has no transactions:
        there the pipeline is plain, and the caller deletes again the entries it added when one of
        them is refused (:func:`split_replies`), so a failed call leaves nothing queued either way.
        """
        shards = sorted({p.shard for p in puts})
        atomic = not self.cluster and len(shards) == 1
        pipe = self.r.pipeline(transaction=atomic)
        for p in puts:
            pipe.xadd(ks.stream(p.shard), p.fields)
        for shard in shards:
            pipe.xlen(ks.stream(shard))
        return pipe, shards, atomic

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
