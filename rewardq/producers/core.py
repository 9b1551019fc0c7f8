"""What the sync and async clients share to put: their settings, encoding and routing records, the
size checks, and the pipelines they send (reading results back is :mod:`rewardq.producers.reading`).

No I/O here; :mod:`rewardq.producers.client` and :mod:`rewardq.producers.aio` run the
commands these helpers describe.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar

from rewardq.errors import RecordError, RewardqError
from rewardq.producers.backpressure import Backlog
from rewardq.queue.blobs import BLOB_CHUNK_BYTES, BLOB_TTL, blob_fields, new_blob
from rewardq.queue.checks import (
    MAX_OUTPUTS,
    MAX_RECORD_BYTES,
    MAX_TRAJECTORY_BYTES,
    CheckedDict,
    check_dict,
    check_index,
    check_name,
    check_trajectory_bytes,
)
from rewardq.queue.codec import encode_output
from rewardq.queue.connection import client_user
from rewardq.queue.images import MAX_IMAGE_BYTES
from rewardq.queue.keys import NAMESPACE, Keyspace, output_key
from rewardq.queue.put_errors import put_error
from rewardq.queue.results import RESULT_TTL

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis, Encodable, SyncRedis


#: Undelivered + in-flight stream entries per shard before ``put_*`` waits for workers.
MAX_BACKLOG = 100_000
#: Seconds ``put_*`` waits for the backlog to drain before raising BackpressureTimeout.
BACKPRESSURE_TIMEOUT = 60.0

#: Seconds ``wait_rewards`` waits when no timeout is given.
WAIT_TIMEOUT = 600.0
#: How often a waiter asks Redis whether the trajectories it awaits have ended (one pipelined
#: ``HGET <traj> state`` each), for those whose ``done`` entry it may not have seen: its XREAD
#: failed and reconnected, a failover lost the entry, the stream was trimmed past where it read.
SWEEP_INTERVAL = 2.0
#: Trajectories asked about per sweep at most (in turn when more wait): a sweep's work is bounded.
SWEEP_MAX = 4096
#: A waiter still reads all its missing keys this often: results its trajectory's state does not
#: show (a late key's error result written after its trajectory ended). Reading every waiter's keys
#: every 2 s instead cost a burst of 2,048 trajectories waiting ~15 s about 1.5 ms of producer CPU
#: per trajectory, more than the put (docs/performance.md).
FULL_RECHECK = 30.0

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
            (:func:`rewardq.reward.tokenizer_fingerprint.tokenizer_fingerprint`), sent with every record so a
            worker decoding with another vocabulary answers with an error instead of a wrong reward.
        result_ttl: how long the ``cancelled`` results :meth:`~rewardq.RewardClient.cancel` writes are
            kept (set it to the workers' ``result_ttl`` when they use another).
        blob_ttl: seconds a record over 1 MiB, sent in pieces (:mod:`rewardq.queue.blobs`), waits
            for a worker before Redis drops it (the worker then answers its key with an error).
    """

    namespace: str = NAMESPACE
    shards: int | None = None
    max_record_bytes: int = MAX_RECORD_BYTES
    max_trajectory_bytes: int = MAX_TRAJECTORY_BYTES
    max_outputs: int = MAX_OUTPUTS
    max_image_bytes: int = MAX_IMAGE_BYTES
    max_backlog: int | None = MAX_BACKLOG
    backpressure_timeout: float = BACKPRESSURE_TIMEOUT
    cluster: bool = False
    tokenizer: str | None = None
    result_ttl: float = RESULT_TTL
    blob_ttl: int = BLOB_TTL


@dataclass
class Put:
    """One XADD: where, what; for a record over :data:`~rewardq.queue.blobs.BLOB_CHUNK_BYTES`, the
    blob its entry names and the record bytes to write there first (:mod:`rewardq.queue.blobs`)."""

    shard: int
    key: str
    fields: dict[Encodable, Encodable]
    size: int
    blob: tuple[str, bytes] | None = None


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
    #: The outputs it puts: ``range(count)`` of a trajectory, or the one ``index`` of put_output.
    index: object = None
    count: int | None = None

    @property
    def keys(self) -> list[str]:
        """The keys it puts; before its records are prepared (Redis failed while the keyspace was
        read), the keys its arguments name, when they are well formed (else none)."""
        if self.puts:
            return [p.key for p in self.puts]
        uid, sid = self.uid, self.session_id
        if not (_is_name(uid) and _is_name(sid)):
            return []
        if self.count is not None:
            return [output_key(str(uid), str(sid), i) for i in range(min(self.count, MAX_OUTPUTS))]
        if _is_name(self.index) and not isinstance(self.index, str) and int(str(self.index)) >= 0:
            return [output_key(str(uid), str(sid), int(str(self.index)))]
        return []

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


def _is_name(x: object) -> bool:
    return isinstance(x, (str, int)) and not isinstance(x, bool)


def output_count(outputs: object) -> int | None:
    """How many outputs a ``put_trajectory`` was given (None: not a list)."""
    if isinstance(outputs, Sequence) and not isinstance(outputs, (str, bytes)):
        return len(outputs)
    return None


def split_replies(puts: Sequence[Put], replies: Sequence[object]) -> tuple[BaseException | None, dict[int, list[Any]]]:
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
    max_outputs: int = MAX_OUTPUTS,
    max_image_bytes: int = MAX_IMAGE_BYTES,
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
    ts = f"{time.time():.6f}"
    if len(data) > BLOB_CHUNK_BYTES:
        name = new_blob(ks, shard)
        return Put(shard, key, blob_fields(key, name, data, ts), len(data), blob=(name, data))
    return Put(shard, key, {"key": key, "data": data, "ts": ts}, len(data))


def check_outputs(outputs: object, max_outputs: int) -> int:
    """How many outputs a ``put_trajectory`` was given; raises RecordError unless it is a list of
    1 to ``max_outputs`` of them."""
    if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence) or isinstance(outputs, Mapping):
        raise RecordError("outputs", f"must be a list of outputs, got {type(outputs).__name__}")
    n = len(outputs)
    if n == 0:
        raise RecordError("outputs", "a trajectory needs at least one output")
    if n > max_outputs:
        raise RecordError("outputs", f"has {n} outputs; a trajectory may have at most max_outputs={max_outputs}")
    return n


def planned_keys(
    uid: object, session_id: object, *, count: int | None = None, index: object = None, max_outputs: int = MAX_OUTPUTS
) -> list[str]:
    """The keys a put of ``count`` outputs (a trajectory) or of the output ``index`` will write,
    checked as its records will be (:func:`~rewardq.queue.checks.check_name`, ``check_index``):
    what a caller can know, and refuse, before anything is encoded."""
    tid_uid, tid_sid = check_name(uid, "uid"), check_name(session_id, "session_id")
    if count is not None:
        return [output_key(tid_uid, tid_sid, i) for i in range(count)]
    return [output_key(tid_uid, tid_sid, check_index(index, max_outputs))]


def prepare_trajectory(
    ks: Keyspace,
    uid: object,
    session_id: object,
    outputs: Sequence[object],
    sample: object,
    *,
    max_bytes: int,
    max_outputs: int = MAX_OUTPUTS,
    max_image_bytes: int = MAX_IMAGE_BYTES,
    max_trajectory_bytes: int = MAX_TRAJECTORY_BYTES,
    tokenizer: str | None = None,
) -> list[Put]:
    """The puts of a whole trajectory; raises RecordError for a bad output, and
    :class:`~rewardq.errors.TrajectoryTooLarge` as soon as the records encoded so far pass
    ``max_trajectory_bytes`` (the rest are not encoded), before anything is written."""
    n = check_outputs(outputs, max_outputs)
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


def settings_from_kwargs(namespace: str, kwargs: dict[str, object]) -> ClientSettings:
    """Split ``from_url`` keyword arguments: ClientSettings fields are taken out of ``kwargs``
    (what is left goes to the Redis connection)."""
    settings = ClientSettings(namespace=namespace, cluster=bool(kwargs.pop("cluster", False)))
    for k in list(kwargs):
        if hasattr(settings, k):
            setattr(settings, k, kwargs.pop(k))
    return settings


class ClientBase(Generic[R]):
    """State the sync and async clients share: the Redis client, settings, backlog gate."""

    def __init__(self, redis: R, settings: ClientSettings | None = None, **overrides: object) -> None:
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
        self, ks: Keyspace, uid: object, session_id: object, outputs: Sequence[object], sample: object
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

    def _send_pipeline(
        self, ks: Keyspace, puts: list[Put], pipeline: Callable[..., Any] | None = None
    ) -> tuple[Any, list[int], bool]:
        """A pipeline holding one XADD per put, then one XLEN per shard touched; returns it, those
        shards (the order of the XLEN replies after the ``len(puts)`` XADD replies) and whether it is
        a transaction. ``pipeline`` makes it (``transaction=``), the client's own by default.

        The puts of one call all go to one shard (a trajectory's). On one Redis they go in MULTI/EXEC:
        all or nothing (a refused XADD discards them all), and a worker blocked in XREADGROUP wakes once
        with every output instead of after the first. redis-py's cluster client has no transactions:
        there the pipeline is plain, and the caller deletes again the entries it added when one of
        them is refused (:func:`split_replies`), so a failed call leaves nothing queued either way.
        """
        shards = sorted({p.shard for p in puts})
        atomic = not self.cluster and len(shards) == 1
        pipe = (pipeline or self.r.pipeline)(transaction=atomic)
        for p in puts:
            pipe.xadd(ks.stream(p.shard), p.fields)
        for shard in shards:
            pipe.xlen(ks.stream(shard))
        return pipe, shards, atomic

    def _trajectory_pipeline(self, ks: Keyspace, tids: Iterable[str]) -> Any:
        """A pipeline holding one HGETALL per trajectory hash (parse each with parse_trajectory)."""
        pipe = self.r.pipeline(transaction=False)
        for t in tids:
            pipe.hgetall(ks.traj_key(t))
        return pipe

    def _state_pipeline(self, ks: Keyspace, tids: Iterable[str]) -> Any:
        """A pipeline holding one ``HGET <traj> state`` per trajectory (see :func:`ended`)."""
        pipe = self.r.pipeline(transaction=False)
        for t in tids:
            pipe.hget(ks.traj_key(t), "state")
        return pipe

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
