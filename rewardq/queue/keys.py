"""The whole rewardq keyspace, in one place.

Every Redis key rewardq reads or writes is built here, and nowhere else. With the
default namespace ``rewardq`` and one shard, the keys are::

    rewardq:meta                         HASH    pipeline settings shared by producers and workers
                                                 (shards, schema version, created_at)
    rewardq:{s0}:stream                  STREAM  incoming output records; fields ``key`` (text) and
                                                 ``data`` (msgpack, see rewardq.queue.codec).
                                                 Consumer group: ``rewardq-workers`` (configurable)
    rewardq:{s0}:traj:<uid>_<session_id> HASH    assembly state of one trajectory: ``o:<i>`` the stored
                                                 record of output i (``r:<i>`` instead: the id of
                                                 the stream entry a record over 1 MiB stays in,
                                                 acknowledged; ``refs`` their count; ``b:<i>`` its
                                                 blob), ``h:<i>`` a digest of it (kept
                                                 after scoring, to tell a redelivery from a different
                                                 record), ``final`` the final index, ``hi`` the
                                                 highest stored index, ``bytes`` the stored
                                                 records' size (at most max_trajectory_bytes),
                                                 ``attempts``/``shared``/``cohort``/``width``/``solo``/``unfinished``/
                                                 ``last_failure``/``handbacks`` (scoring attempts
                                                 and how the unfinished ones ended), ``acks``
                                                 entry ids to
                                                 acknowledge at commit (at most max_outputs + 16),
                                                 ``ack_blobs`` (blobs of duplicates in ``acks``,
                                                 deleted with them),
                                                 ``whole`` (entry ids, when all outputs arrived in one
                                                 read and the records stay in the stream until the
                                                 commit), ``state`` (collecting|done), ``first_seen``,
                                                 ``last_seen``, ``lease``/``lease_until``/
                                                 ``lease_life`` (the process life that took it)
                                                 while scored,
                                                 ``retries``/``retry_since``/``retry_at``/
                                                 ``retry_reason`` (transient failures retried in
                                                 place), ``worker``, ``status``, ``error``,
                                                 ``failure_kind``, ``done_at`` and ``n`` once it
                                                 ended; a copy of small results for producers
                                                 (``result_rows``, ``result:<row>:<field>``) once
                                                 committed.  Records (``o:<i>``, ``r:<i>``'s entries) are deleted
                                                 when it ends, scored or failed (or moved to
                                                 ``records`` with keep_records); the rest expires
                                                 with the results.
    rewardq:{s0}:reward:<uid>_<session_id>_<i>
                                         HASH    the result of one output key, all readable text:
                                                 ``status`` (ok|error|cancelled), ``reward_score``,
                                                 ``reward_extra_info`` (JSON), ``error``,
                                                 ``failure_kind`` (errors only), ``worker``,
                                                 ``manager``, ``scored_at``, ``latency_ms``,
                                                 ``provenance``, ``attempt``, ``judge_request``
    rewardq:{s0}:records:<uid>_<session_id>
                                         HASH    the stored outputs (``o:<i>``) of an ended trajectory,
                                                 scored or failed, kept for ``rewardq inspect`` and
                                                 ``rewardq dead-letters retry`` only when
                                                 ``keep_records`` > 0, and only for that many seconds
                                                 (off by default: it costs memory)
    rewardq:{s0}:staged:<uid>_<session_id>:<token>:<i>
                                         HASH    one key's result while a trajectory too large for one
                                                 commit script is committed in chunks; renamed to its
                                                 ``reward`` key by the last chunk, which also acks
                                                 (expires after a few minutes if the worker died)
    rewardq:{s0}:stage-lease             HASH    who may stage a chunked commit now (``token``, ``until``,
                                                 the ``prefix`` and count of its ``staged`` keys); on
                                                 one Redis only shard 0's is used (lua/stage.lua)
    rewardq:{s0}:waiting                 ZSET    trajectories still collecting outputs, scored by the
                                                 time they expire (last_seen + incomplete_timeout)
    rewardq:{s0}:waiting:expired:<worker> HASH   a worker's last expire reply, kept 60 s for the same call
                                                 sent again after its reply was lost (lua/expire.lua)
    rewardq:{s0}:done                    STREAM  one entry per finished trajectory (``tid``, ``n``,
                                                 ``status``, ``worker``, ``latency_ms``, and a result
                                                 shared by every key when at most 1 KiB:
                                                 ``result_rows`` = 1, ``result:0:<field>``); capped;
                                                 wakes up ``wait_rewards`` (which then reads nothing
                                                 more) and feeds ``rewardq status``
    rewardq:{s0}:dead                    STREAM  dead letters: the raw entry (whole up to 1 MiB, else
                                                 its first 64 KiB), reason, traceback, delivery count,
                                                 worker, time; bounded by dead_letter_bytes and
                                                 DEAD_MAXLEN, expires dead_letter_ttl after the last
    rewardq:{s0}:blob:<token>            HASH    a record over 1 MiB in pieces of 1 MiB (fields ``0``..),
                                                 named by its stream entry (``blob``, ``size``,
                                                 ``chunks`` instead of ``data``); expires after
                                                 blob_ttl unless a worker keeps it for its
                                                 trajectory (``b:<i>``), deleted with the entry
    rewardq:{s0}:dead:bytes              HASH    ``n``: the bytes the dead letters take (``add_dead``
                                                 in lua/common.lua builds this name from the stream's)
    rewardq:workers                      ZSET    live workers by last heartbeat (unix seconds)
    rewardq:worker:<name>                HASH    one worker's heartbeat: host, pid, in_flight, scored,
                                                 errors, started_at, life (the id its leases carry:
                                                 ``lease_life``), ... (expires when it stops beating)
    rewardq:ratelimit:<limiter>          HASH    fleet-wide token buckets and concurrency slots
    rewardq:lock:<name>                  STRING  short TTL'd locks for periodic maintenance
    rewardq:judge:<sha256>               HASH    one LLM-judge request (digest of its full body): ``a``
                                                 the answer, kept for result_ttl; ``c``/``cu`` the claim
                                                 of the worker sending it (rewardq.reward.judge.cache)
    rewardq:judge-stats                  HASH    fleet-wide judge counters, ``<counter>:<model>``
    rewardq:cancels                      STRING  a counter producers raise after each ``cancel``; workers
                                                 watch it to stop scoring cancelled trajectories
    rewardq:verl-budget:<run>            HASH    one verl run's failure budget: the outcomes of its last
                                                 ``verl_error_window`` trajectories as a ring, counts per
                                                 failure kind, and the run's totals (lua/budget.lua);
                                                 ``<run>`` is the Ray job (or ``local``)
    rewardq:provenance                   HASH    what produced results: ``<digest>`` -> a provenance blob
                                                 (JSON: scoring fingerprint, version, scorer, judge,
                                                 isolation), one per scorer and configuration, named by
                                                 each result's ``provenance`` field (rewardq.reward.provenance)
    rewardq:replay                       STRING  the mark of the ``rewardq replay`` a ``--namespace`` was
                                                 given to (JSON: its ``--out``'s id, scoring
                                                 fingerprint and ``--out``): only a replay with the
                                                 same mark runs there again (rewardq.replay.namespace),
                                                 and no other worker starts there
                                                 (rewardq.consumers.compose)

``{s0}`` is a Redis Cluster hash tag: every key of one shard lives in one hash slot, so
the Lua scripts that store a record, commit a result and acknowledge the entry touch a
single slot. A trajectory's shard is ``crc32(<uid>_<session_id>) % shards``; the tags of
the shards are chosen so that their slots spread evenly over the 16384 cluster slots
(``s<shard>`` when that already lands in the shard's share of the slots, otherwise
``s<shard>.<k>`` for the smallest such ``k``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from functools import cached_property

from redis.crc import key_slot

#: First component of every key; two pipelines on one Redis use two namespaces.
NAMESPACE = "rewardq"
#: The consumer group every worker of a pipeline joins.
GROUP = "rewardq-workers"
#: Longest ``uid``, in bytes of UTF-8 (Redis counts key lengths in bytes, so every limit on a key
#: does too); verl's uids are 36-character UUIDs.
MAX_UID_BYTES = 256
#: Longest ``session_id``, in bytes of UTF-8; verl's session ids are small integers.
MAX_SESSION_ID_BYTES = 64
#: Longest ``key`` field of a stream entry a worker will parse or write anywhere (dead letters keep a
#: cut copy), in bytes: ``<uid>_<session_id>_<index>`` with the longest uid, session id and index.
MAX_KEY_BYTES = MAX_UID_BYTES + MAX_SESSION_ID_BYTES + 24
#: Shard count of a namespace that does not exist yet.
SHARDS = 1
#: Entries a shard's ``done`` stream keeps (approximately): the latest finished trajectories.
DONE_MAXLEN = 100_000
#: Entries a shard's dead-letter stream keeps (approximately).
DEAD_MAXLEN = 1_000_000
#: Bytes a shard's dead-letter stream keeps at most (field names and values; the oldest dead
#: letters go first), and seconds it keeps a dead letter.
DEAD_LETTER_BYTES = 64 * 1024 * 1024
DEAD_LETTER_TTL = 7 * 86400.0


_SLOTS = 16384


def trajectory_id(uid: str, session_id: str) -> str:
    """``<uid>_<session_id>``: what the keys of one trajectory share."""
    return f"{uid}_{session_id}"


def output_key(uid: str, session_id: str, index: int) -> str:
    """``<uid>_<session_id>_<index>``: the key of one output, as verl names it."""
    return f"{uid}_{session_id}_{index}"


def split_key(key: str) -> tuple[str, int]:
    """Split an output key into ``(trajectory_id, index)``.

    The index is the text after the *last* underscore. Session ids never hold an underscore
    (producers and workers refuse them), so ``<uid>_<session_id>`` splits at its last one too,
    and uids may hold underscores.

    >>> split_key("my_uid_s1_3")
    ('my_uid_s1', 3)
    """
    tid, sep, idx = key.rpartition("_")
    if not sep or not tid or not idx.isdigit():
        raise ValueError(
            f"{key!r} is not an output key: expected '<uid>_<session_id>_<index>' with a non-negative integer index"
        )
    return tid, int(idx)


def parse_key(key: str) -> tuple[str, str, str] | None:
    """``(uid, session_id, index_digits)`` of a well-formed output key, else None.

    Strict: the index is canonical decimal digits (``0``, ``17``; not ``007``), uid and session
    id are non-empty, and the whole key is at most ``MAX_KEY_BYTES`` bytes of UTF-8 long (its uid
    and session id within their own byte limits, as the producer checks them). Used to answer for a
    stream entry whose record cannot be read, by the key the entry names.
    """
    if not isinstance(key, str) or len(key) > MAX_KEY_BYTES:
        return None
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return None
    if size > MAX_KEY_BYTES:
        return None
    tid, sep, idx = key.rpartition("_")
    uid, sep2, sid = tid.rpartition("_")
    if not (sep and sep2 and uid and sid and idx.isascii() and idx.isdigit()) or idx != str(int(idx)):
        return None
    if len(uid.encode("utf-8")) > MAX_UID_BYTES or len(sid.encode("utf-8")) > MAX_SESSION_ID_BYTES:
        return None
    return uid, sid, idx


def _spread_tag(shard: int, shards: int) -> str:
    lo, hi = shard * _SLOTS // shards, (shard + 1) * _SLOTS // shards
    base = f"s{shard}"
    if lo <= key_slot(base.encode()) < hi:
        return base
    k = 0
    while True:
        tag = f"{base}.{k}"
        if lo <= key_slot(tag.encode()) < hi:
            return tag
        k += 1


@dataclass(frozen=True)
class Keyspace:
    """Builds every key of one rewardq namespace.

    Args:
        namespace: first component of every key; two pipelines on one Redis use two
            namespaces.
        shards: how many streams the records are split over (1 on a single Redis; a
            few per cluster master on Redis Cluster). Producers and workers must agree;
            the value is stored in ``<ns>:meta`` by whoever starts first.
        group: consumer group name.
    """

    namespace: str = NAMESPACE
    shards: int = SHARDS
    group: str = GROUP
    _tags: tuple[str, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        if not self.namespace or any(c in self.namespace for c in "{} \n"):
            raise ValueError(f"namespace {self.namespace!r} must be non-empty, without braces or spaces")
        if self.shards < 1:
            raise ValueError(f"shards must be >= 1, got {self.shards}")
        object.__setattr__(self, "_tags", tuple(_spread_tag(s, self.shards) for s in range(self.shards)))

    # -- routing -----------------------------------------------------------------
    def shard_of(self, tid: str) -> int:
        """The shard of a trajectory id (stable across processes and machines)."""
        if self.shards == 1:
            return 0
        return zlib.crc32(tid.encode("utf-8", "surrogatepass")) % self.shards

    def shard_of_key(self, key: str) -> int:
        return self.shard_of(split_key(key)[0])

    def _p(self, shard: int) -> str:
        return f"{self.namespace}:{{{self._tags[shard]}}}"

    # -- per-shard keys ------------------------------------------------------------
    def stream(self, shard: int) -> str:
        return f"{self._p(shard)}:stream"

    @cached_property
    def streams(self) -> list[str]:
        return [self.stream(s) for s in range(self.shards)]

    def traj(self, shard: int, tid: str) -> str:
        return f"{self._p(shard)}:traj:{tid}"

    def traj_prefix(self, shard: int) -> str:
        return f"{self._p(shard)}:traj:"

    def reward(self, shard: int, key: str) -> str:
        return f"{self._p(shard)}:reward:{key}"

    def reward_prefix(self, shard: int) -> str:
        return f"{self._p(shard)}:reward:"

    def records(self, shard: int, tid: str) -> str:
        return f"{self._p(shard)}:records:{tid}"

    def records_prefix(self, shard: int) -> str:
        return f"{self._p(shard)}:records:"

    def staged(self, shard: int, tid: str, token: str) -> str:
        """The prefix of one chunked commit's staged results (``<prefix><i>`` for key ``i``)."""
        return f"{self._p(shard)}:staged:{tid}:{token}:"

    def stage_lease(self, shard: int) -> str:
        """The lease of the one chunked commit that may stage results at a time (``lua/stage.lua``)."""
        return f"{self._p(shard)}:stage-lease"

    def waiting(self, shard: int) -> str:
        return f"{self._p(shard)}:waiting"

    def done(self, shard: int) -> str:
        return f"{self._p(shard)}:done"

    def dead(self, shard: int) -> str:
        return f"{self._p(shard)}:dead"

    def blob(self, shard: int, token: str) -> str:
        """The blob of one record over 1 MiB (:mod:`rewardq.queue.blobs`; ``token``: 32 hex digits)."""
        return f"{self.blob_prefix(shard)}{token}"

    def blob_prefix(self, shard: int) -> str:
        """The prefix of the blobs of records over 1 MiB (``<prefix><32 hex>``, :mod:`rewardq.queue.blobs`)."""
        return f"{self._p(shard)}:blob:"

    def expired_reply(self, shard: int, worker: str) -> str:
        """Where ``worker``'s last expire call on ``shard`` keeps its reply for 60 s, under the call's
        nonce (``lua/expire.lua``, :func:`~rewardq.queue.endings.call_nonce`)."""
        return f"{self.waiting(shard)}:expired:{worker}"

    def dead_bytes(self, shard: int) -> str:
        """The byte count of ``dead(shard)`` (the scripts build it as ``dead .. ':bytes'``)."""
        return f"{self.dead(shard)}:bytes"

    # -- convenience for one key / trajectory ----------------------------------------
    def reward_key(self, key: str) -> str:
        """The result hash of an output key."""
        return self.reward(self.shard_of_key(key), key)

    def traj_key(self, tid: str) -> str:
        return self.traj(self.shard_of(tid), tid)

    # -- global keys -------------------------------------------------------------------
    @property
    def meta(self) -> str:
        return f"{self.namespace}:meta"

    @property
    def workers(self) -> str:
        return f"{self.namespace}:workers"

    def worker(self, name: str) -> str:
        return f"{self.namespace}:worker:{name}"

    def ratelimit(self, name: str) -> str:
        return f"{self.namespace}:ratelimit:{name}"

    def lock(self, name: str) -> str:
        return f"{self.namespace}:lock:{name}"

    def judge(self, digest: str) -> str:
        """The answer cache and send claim of one LLM-judge request (:mod:`rewardq.reward.judge.cache`)."""
        return f"{self.namespace}:judge:{digest}"

    @property
    def judge_stats(self) -> str:
        """The fleet's judge counters per model."""
        return f"{self.namespace}:judge-stats"

    @property
    def cancels(self) -> str:
        """How many cancellations producers made (``RewardClient.cancel``): workers watch it to stop
        scoring what was cancelled (:mod:`rewardq.queue.cancels`)."""
        return f"{self.namespace}:cancels"

    def verl_budget(self, run: str) -> str:
        """One verl run's failure budget (:mod:`rewardq.queue.failure_budget`)."""
        return f"{self.namespace}:verl-budget:{run}"

    @property
    def provenance(self) -> str:
        """The provenance blobs results name by digest (:mod:`rewardq.queue.provenance`)."""
        return f"{self.namespace}:provenance"

    @property
    def replay(self) -> str:
        """The mark of the replay a named namespace belongs to (:mod:`rewardq.replay.namespace`)."""
        return f"{self.namespace}:replay"
