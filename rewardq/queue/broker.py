"""The worker's view of Redis: every stream and script operation, nothing else.

:class:`StreamBroker` is the only place the worker talks to Redis. Each method is one
named step of the worker loop (read, reclaim, store, commit, fail, expire, renew,
release, heartbeat) and documents what it guarantees. It works on one Redis and on
Redis Cluster: every multi-key call stays inside one shard's hash slot.

What it reads and what filing a record answers are :mod:`rewardq.queue.entries`; its Lua
scripts run through :class:`~rewardq.queue.script_runner.ScriptRunner` (NOSCRIPT and cluster
routing); the shard count it is built with is agreed in :mod:`rewardq.queue.meta`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT, KeyT, StreamIdT

from rewardq import defaults
from rewardq.queue.codec import OutputRecord, record_digest
from rewardq.queue.connection import is_cluster_client
from rewardq.queue.entries import Entry, StoreOutcome, entries_from_reply
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import (
    RESULT_FIELDS,
    EncodedResults,
    RewardResult,
    as_text,
    encode_results,
    error_extra_info,
)
from rewardq.queue.script_runner import Call, ScriptRunner
from rewardq.queue.states import FailureKind, ResultStatus
from rewardq.queue.text import reason_text, utf8

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

__all__ = ["RESULT_FIELDS", "CLAIMABLE_BYTE_BUDGET", "COMMIT_BYTE_BUDGET", "StreamBroker"]

#: Bytes of entries ``claimable.lua`` reads in one call before it leaves the rest for a later pass.
CLAIMABLE_BYTE_BUDGET = 64 * 1024 * 1024
#: Bytes one ``commit`` script call writes at most (a single key's result larger than this, up to
#: ``max_result_bytes``, goes alone). Redis does not enforce ``maxmemory`` inside a script, and a
#: script holds every client while it runs: 8 MiB is written in a few ms, and a trajectory with
#: more results is committed in chunks (see ``lua/commit.lua``).
COMMIT_BYTE_BUDGET = 8 * 1024 * 1024
#: Seconds the staged results of a chunked commit live, should its worker die between the chunks.
STAGE_TTL = 600
#: Longest ``reason`` and ``traceback`` kept in a dead letter, in characters.
DEAD_REASON_CHARS = 4000
DEAD_TRACEBACK_CHARS = 8000


_s = as_text


class StreamBroker:
    """Stream and script operations for one worker.

    Args:
        client: a ``redis.asyncio`` client (or cluster client) with ``decode_responses=False``.
        ks: the keyspace (namespace, shard count, group).
        worker: this worker's consumer name (unique in the group).
        result_ttl: seconds results and finished trajectories live; 0 keeps them forever.
        lease_seconds: how long a trajectory stays leased without renewal.
        incomplete_timeout: seconds a trajectory may wait for missing outputs.
        max_outputs: the bound every script is given for a trajectory's outputs (never a record's).
        keep_records: seconds an ended trajectory's records are kept (0: deleted when it ends).
        max_trajectory_bytes: the most a trajectory's stored records may take (``store`` refuses more).
        max_result_bytes: the most one key's result may take (results are checked before a commit).
        commit_bytes: the most one ``commit`` script call writes (larger trajectories go in chunks).
    """

    def __init__(
        self,
        client: AsyncRedis,
        ks: Keyspace,
        *,
        worker: str,
        result_ttl: float = defaults.RESULT_TTL,
        lease_seconds: float = defaults.LEASE_SECONDS,
        incomplete_timeout: float = defaults.INCOMPLETE_TIMEOUT,
        done_maxlen: int = defaults.DONE_MAXLEN,
        dead_maxlen: int = defaults.DEAD_MAXLEN,
        keep_records: float = defaults.KEEP_RECORDS,
        max_outputs: int = defaults.MAX_OUTPUTS,
        max_trajectory_bytes: int = defaults.MAX_TRAJECTORY_BYTES,
        max_result_bytes: int = defaults.MAX_RESULT_BYTES,
        commit_bytes: int = COMMIT_BYTE_BUDGET,
    ) -> None:
        self.r = client
        self.ks = ks
        self.worker = worker
        self.result_ttl = int(result_ttl)
        self.lease_seconds = lease_seconds
        self.incomplete_timeout = incomplete_timeout
        self.done_maxlen = done_maxlen
        self.dead_maxlen = dead_maxlen
        self.keep_records = keep_records
        self.max_outputs = int(max_outputs)
        self.max_trajectory_bytes = int(max_trajectory_bytes)
        self.max_result_bytes = int(max_result_bytes)
        self.commit_bytes = int(commit_bytes)
        self.cluster = is_cluster_client(client)
        self.scripts = ScriptRunner(client)

    # -- set-up ------------------------------------------------------------------------
    async def ensure_groups(self) -> None:
        """Create every shard's stream and consumer group (from the start of the stream)."""
        for stream in self.ks.streams:
            try:
                await self.r.xgroup_create(stream, self.ks.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    # -- read ----------------------------------------------------------------------------
    async def read(self, shards: Sequence[int], count: int, block_ms: int | None) -> list[Entry]:
        """New entries (``>``) from the given shards, up to ``count`` per stream."""
        streams: dict[KeyT, StreamIdT] = {self.ks.stream(s): ">" for s in shards}
        resp = await self.r.xreadgroup(self.ks.group, self.worker, streams, count=count, block=block_ms)
        return entries_from_reply(resp, self.ks)

    async def reclaim(self, shard: int, min_idle_ms: int, count: int) -> list[Entry]:
        """Take over entries other (dead) workers left pending for ``min_idle_ms``.

        Entries of trajectories still leased to another worker are skipped (see
        ``lua/claimable.lua``), so a dead worker's lease running out costs no deliveries.

        Returns the claimed entries, each with its delivery count (the caller dead-letters
        those delivered more than ``max_deliveries`` times).
        """
        stream = self.ks.stream(shard)
        pending = await self.r.xpending_range(stream, self.ks.group, min="-", max="+", count=count, idle=min_idle_ms)
        if not pending:
            return []
        ids = [_s(p["message_id"]) for p in pending]
        counts = {_s(p["message_id"]): int(p["times_delivered"]) for p in pending}
        args = [self.ks.traj_prefix(shard), self.worker, defaults.MAX_KEY_BYTES, CLAIMABLE_BYTE_BUDGET, *ids]
        claimable: list[StreamIdT] = [_s(i) for i in await self.scripts.run("claimable", [stream], args)]
        if not claimable:
            return []
        claimed_raw = await self.r.xclaim(stream, self.ks.group, self.worker, min_idle_ms, claimable)
        claimed = []
        for eid, fields in claimed_raw or []:
            if fields is None:
                continue
            e = Entry(shard, _s(eid), fields, deliveries=counts.get(_s(eid), 0) + 1)
            claimed.append(e)
        return claimed

    # -- store ---------------------------------------------------------------------------
    async def store(self, items: Sequence[tuple[Entry, OutputRecord, bytes]]) -> list[StoreOutcome]:
        """File each record in its trajectory hash (one pipelined round trip).

        For each record, exactly one of: parked (acked, waiting for more outputs),
        complete (this worker holds the lease and must score, then :meth:`commit`; with its
        ``attempts`` and, after an attempt that never finished, its ``solo`` starts),
        leased (another live worker scores it), done (already finished; acked),
        conflict (contradicts stored data; the caller must :meth:`fail`), toolarge (storing it
        would take the trajectory past ``max_trajectory_bytes``; the caller must :meth:`fail`).
        """
        if not items:
            return []
        calls = []
        for entry, rec, payload in items:
            s = entry.shard
            calls.append(
                (
                    [self.ks.traj(s, rec.tid), self.ks.stream(s), self.ks.waiting(s), self.ks.done(s)],
                    [
                        self.ks.group,
                        entry.id,
                        rec.tid,
                        rec.index,
                        1 if rec.final else 0,
                        record_digest(payload),
                        self.incomplete_timeout,
                        self.lease_seconds,
                        self.worker,
                        self.ks.reward_prefix(s),
                        self.result_ttl,
                        self.done_maxlen,
                        self.max_outputs,
                        self.max_trajectory_bytes,
                    ],
                )
            )
        replies = await self.scripts.run_many("store", calls)
        out = []
        for (entry, rec, _), reply in zip(items, replies):
            if isinstance(reply, Exception):
                raise reply
            kind = _s(reply[0])
            if kind == "complete":
                out.append(
                    StoreOutcome(kind, entry, rec, payloads=list(reply[4:]), attempts=int(reply[2]), solo=int(reply[3]))
                )
            elif kind in ("leased", "conflict", "toolarge"):
                out.append(StoreOutcome(kind, entry, rec, detail=_s(reply[1])))
            else:
                out.append(StoreOutcome(kind, entry, rec, detail=_s(reply[1]) if len(reply) > 1 else ""))
        return out

    async def claim_whole(self, groups: Sequence[tuple[int, str, list[Entry]]]) -> list[bool]:
        """Fast path: lease trajectories whose outputs ``0..final`` were all read at once.

        ``groups`` holds ``(shard, tid, entries in index order)``. True: this worker holds the
        lease and must score and :meth:`commit` (the entries stay pending until then). False:
        the trajectory is already known; file its records with :meth:`store` instead.
        """
        if not groups:
            return []
        calls = [
            (
                [self.ks.traj(shard, tid)],
                [
                    self.worker,
                    self.lease_seconds,
                    self.max_outputs,
                    len(entries),
                    *(e.id for e in entries),
                    *(record_digest(e.data) for e in entries),
                ],
            )
            for shard, tid, entries in groups
        ]
        out = []
        for reply in await self.scripts.run_many("claim", calls):
            if isinstance(reply, Exception):
                raise reply
            out.append(_s(reply[0]) == "complete")
        return out

    # -- finish ----------------------------------------------------------------------------
    def encode(self, results: Sequence[RewardResult] | EncodedResults) -> EncodedResults:
        """``results`` checked and encoded for a commit (:func:`~rewardq.queue.results.encode_results`
        with this broker's ``max_result_bytes``); raises ResultError for a result that cannot be stored."""
        return results if isinstance(results, EncodedResults) else encode_results(results, self.max_result_bytes)

    def commit_calls(self, shard: int, tid: str, enc: EncodedResults, status: str = ResultStatus.OK) -> list[Call]:
        """The ``commit`` script calls of one trajectory, in order: one when its results take at
        most ``commit_bytes``, else stage calls of at most ``commit_bytes`` each, then the final one
        (which makes them visible, acks and publishes; see ``lua/commit.lua``)."""
        chunks = self._chunks(enc)
        staged = self.ks.staged(shard, tid, secrets.token_hex(8)) if len(chunks) > 1 else ""
        return [self._commit_call(shard, tid, enc, status, first, last, staged) for first, last in chunks]

    def _chunks(self, enc: EncodedResults) -> list[tuple[int, int]]:
        """``(first, last)`` key ranges of at most ``commit_bytes`` each (a bigger key goes alone)."""
        n = enc.n
        if enc.written_bytes <= self.commit_bytes:
            return [(0, n - 1)]
        if len(enc.rows) == 1:
            per = max(1, self.commit_bytes // max(1, enc.sizes[0]))
            return [(a, min(n, a + per) - 1) for a in range(0, n, per)]
        chunks, first, size = [], 0, 0
        for i in range(n):
            if i > first and size + enc.sizes[i] > self.commit_bytes:
                chunks.append((first, i - 1))
                first, size = i, 0
            size += enc.sizes[i]
        chunks.append((first, n - 1))
        return chunks

    async def commit(
        self, shard: int, tid: str, results: Sequence[RewardResult] | EncodedResults, status: str = ResultStatus.OK
    ) -> bool:
        """Write every key's result, then acknowledge the trajectory's entries (atomically).

        ``results`` are checked and encoded first (:meth:`encode`: a result that cannot be stored
        raises ResultError before anything is sent). A trajectory whose results take more than
        ``commit_bytes`` goes in several script calls, one after another, the last of which makes
        them all visible together with the acknowledgement (``lua/commit.lua``).
        Idempotent: a second commit of a finished trajectory only re-acknowledges.
        Returns True when this call finished it.
        """
        return await self._run_commit(self.commit_calls(shard, tid, self.encode(results), status))

    async def _run_commit(self, calls: list[Call]) -> bool:
        reply = None
        for keys, args in calls:  # one at a time: at most one chunk's bytes in flight
            reply = await self.scripts.run("commit", keys, args)
        return bool(reply)

    async def commit_many(self, items: Sequence[tuple[int, str, Sequence[RewardResult] | EncodedResults]]) -> list[Any]:
        """:meth:`commit` of several trajectories in one round trip (each still atomic on its own).

        Returns, in order, True/False as :meth:`commit` would, or the exception of that trajectory
        alone (its results could not be encoded, or its script failed). Trajectories that need
        several script calls are committed after the others, each on its own.
        """
        out: list[Any] = [None] * len(items)
        single: list[tuple[int, Call]] = []
        chunked: list[tuple[int, list[Call]]] = []
        for i, (shard, tid, results) in enumerate(items):
            try:
                enc = self.encode(results)
            except Exception as exc:  # noqa: BLE001 - this trajectory's own failure, returned for it
                out[i] = exc
                continue
            calls = self.commit_calls(shard, tid, enc)
            if len(calls) == 1:
                single.append((i, calls[0]))
            else:
                chunked.append((i, calls))
        if single:
            replies = await self.scripts.run_many("commit", [call for _, call in single])
            for (i, _), r in zip(single, replies):
                out[i] = r if isinstance(r, Exception) else bool(r)
        for i, calls in chunked:
            try:
                out[i] = await self._run_commit(calls)
            except Exception as exc:  # noqa: BLE001 - returned for that trajectory alone
                out[i] = exc
        return out

    def _commit_call(
        self, shard: int, tid: str, enc: EncodedResults, status: str, first: int, last: int, staged: str
    ) -> Call:
        """The ``commit`` script's ``(keys, args)`` for keys ``first..last`` of one trajectory."""
        rows = enc.rows if len(enc.rows) == 1 else enc.rows[first : last + 1]
        values = [v for row in rows for v in row]
        args = [
            self.ks.group,
            tid,
            self.worker,
            self.result_ttl,
            self.done_maxlen,
            enc.n,
            first,
            last,
            staged,
            STAGE_TTL,
            self.ks.reward_prefix(shard),
            status,
            self.keep_records,
            self.max_outputs,
            max(self.commit_bytes, self.max_result_bytes),
            len(RESULT_FIELDS),
            *RESULT_FIELDS,
            len(rows),
            *values,
        ]
        keys = [
            self.ks.traj(shard, tid),
            self.ks.stream(shard),
            self.ks.waiting(shard),
            self.ks.done(shard),
            self.ks.records(shard, tid),
        ]
        return keys, args

    async def fail(
        self,
        shard: int,
        tid: str,
        message: str,
        *,
        index: int | str = -1,
        entry: Entry | None = None,
        dead: dict[str, Any] | None = None,
        also_ack: Sequence[Entry] = (),
        kind: FailureKind,
        extra_info: Mapping[str, Any] | None = None,
        provenance: str = "",
        attempt: int = 0,
    ) -> int:
        """Finish a trajectory with an error result for all its keys; dead-letter and ack ``entry``.

        ``index`` is the output the failure is about (-1: none; digits beyond ``max_outputs`` name
        that one key only). Keys that already have a result keep it. ``also_ack``: more entries of
        the trajectory to acknowledge with it (at most ``max_outputs``). ``kind`` is every error
        result's ``failure_kind``; ``extra_info`` goes into their ``reward_extra_info`` beside
        ``error`` (:func:`~rewardq.queue.results.error_extra_info`); ``provenance`` and ``attempt``
        say what failed (:mod:`rewardq.reward.provenance`) and on which attempt. The message is cut to
        :data:`~rewardq.queue.text.MAX_REASON_BYTES` and every text made valid UTF-8, so no string
        a reward function produced can make the failure itself fail. The trajectory's stored records
        are deleted (kept ``keep_records`` seconds when set).
        """
        keys = [
            self.ks.traj(shard, tid),
            self.ks.stream(shard),
            self.ks.waiting(shard),
            self.ks.done(shard),
            self.ks.dead(shard),
            self.ks.records(shard, tid),
        ]
        acks = [e.id for e in also_ack if entry is None or e.id != entry.id][: self.max_outputs]
        reason = reason_text(message)
        args: list[Any] = [
            self.ks.group,
            tid,
            self.ks.reward_prefix(shard),
            self.result_ttl,
            reason,
            self.worker,
            str(index),
            entry.id if entry else "",
            self.done_maxlen,
            self.dead_maxlen,
            self.max_outputs,
            self.keep_records,
            FailureKind(kind).value,
            error_extra_info(reason, extra_info),
            provenance,
            str(attempt) if attempt else "",
            len(acks),
            *acks,
        ]
        for k, v in (dead or {}).items():
            args.extend([k, dead_value(k, v)])
        return int(await self.scripts.run("fail", keys, args))

    # -- attempts that never finished --------------------------------------------------------
    async def note_unfinished(self, shard: int, tid: str, why: str) -> None:
        """Record that this worker's attempt at ``tid`` ended without an answer, and why (a commit
        that failed, say), so a later dead letter tells it apart from a worker that died; and drop
        this worker's lease, so the next attempt starts at once (``lua/unfinished.lua``)."""
        await self.scripts.run("unfinished", [self.ks.traj(shard, tid)], [self.worker, reason_text(why, 500)])

    async def attempt_history(self, shard: int, tid: str) -> dict[str, Any]:
        """``attempts`` (leases taken, hand-backs not counted), ``unfinished`` (attempts that ended
        without an answer and said so), ``last_failure``, and ``handbacks`` (attempts handed back by
        workers that stopped) of a trajectory."""
        attempts, unfinished, last, handbacks = await self.r.hmget(  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
            self.ks.traj(shard, tid), ["attempts", "unfinished", "last_failure", "handbacks"]
        )
        return {
            "attempts": int(attempts or 0),
            "unfinished": int(unfinished or 0),
            "last_failure": as_text(last) if last else "",
            "handbacks": int(handbacks or 0),
        }

    async def dead_letter_entry(self, entry: Entry, dead: dict[str, Any]) -> None:
        """Dead-letter an entry that names no trajectory at all, and ack it."""
        stream = self.ks.stream(entry.shard)
        pipe = self.r.pipeline(transaction=not self.cluster)
        fields: dict[FieldT, EncodableT] = {k: dead_value(k, v) for k, v in dead.items()}
        pipe.xadd(self.ks.dead(entry.shard), fields, maxlen=self.dead_maxlen, approximate=True)
        pipe.xack(stream, self.ks.group, entry.id)
        pipe.xdel(stream, entry.id)
        await pipe.execute()

    async def expire_incomplete(self, shard: int, limit: int = defaults.EXPIRE_BATCH) -> list[tuple[str, str]]:
        """End trajectories of ``shard`` whose outputs stopped arriving; returns ``(tid, reason)``."""
        keys = [self.ks.waiting(shard), self.ks.stream(shard), self.ks.done(shard), self.ks.dead(shard)]
        args = [
            self.ks.group,
            self.ks.traj_prefix(shard),
            self.ks.reward_prefix(shard),
            self.result_ttl,
            self.worker,
            limit,
            f"{self.incomplete_timeout:g}",
            self.done_maxlen,
            self.dead_maxlen,
            self.max_outputs,
            self.ks.records_prefix(shard),
            self.keep_records,
        ]
        out = await self.scripts.run("expire", keys, args)
        return [(_s(out[i]), _s(out[i + 1])) for i in range(0, len(out), 2)]

    # -- crash attribution -----------------------------------------------------------------
    async def start_solo(self, shard: int, tid: str, by: int = 1) -> int:
        """Count a start of scoring this trajectory alone; returns the count, this one included.

        A start that was never followed by a commit means the worker died while this
        trajectory, and nothing else, was being scored: it took the process down. ``by=-1``
        takes a start back (it was handed back at shutdown, not crashed).
        """
        return int(await self.r.hincrby(self.ks.traj(shard, tid), "solo", by))  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones

    # -- leases ----------------------------------------------------------------------------
    async def renew(self, held: dict[int, list[str]]) -> int:
        """Extend leases on trajectories still being scored (``{shard: [tid, ...]}``)."""
        n = 0
        for shard, tids in held.items():
            if tids:
                keys = [self.ks.stream(shard), *(self.ks.traj(shard, t) for t in tids)]
                n += int(await self.scripts.run("renew", keys, [self.ks.group, self.worker, self.lease_seconds]))
        return n

    async def release(self, held: dict[int, list[str]], idle_ms: int) -> int:
        """Hand trajectories back so another worker reclaims them immediately."""
        n = 0
        for shard, tids in held.items():
            if tids:
                keys = [self.ks.stream(shard), *(self.ks.traj(shard, t) for t in tids)]
                n += int(await self.scripts.run("release", keys, [self.ks.group, self.worker, idle_ms]))
        return n

    # -- presence ---------------------------------------------------------------------------
    async def heartbeat(self, stats: dict[str, Any], ttl: float) -> None:
        """Publish this worker's liveness and counters (``<ns>:worker:<name>``, ``<ns>:workers``)."""
        key = self.ks.worker(self.worker)
        now = time.time()
        mapping = {
            k: (v if isinstance(v, (str, bytes)) else repr(v) if isinstance(v, float) else str(v))
            for k, v in stats.items()
        }
        mapping["last_beat"] = f"{now:.3f}"
        await self.r.hset(key, mapping=mapping)  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
        await self.r.expire(key, max(1, int(ttl)))
        await self.r.zadd(self.ks.workers, {self.worker: now})

    async def unregister(self) -> None:
        await self.r.delete(self.ks.worker(self.worker))
        await self.r.zrem(self.ks.workers, self.worker)
        for stream in self.ks.streams:
            try:
                info = await self.r.xinfo_consumers(stream, self.ks.group)
            except ResponseError:
                continue
            mine = [c for c in info if _s(c.get("name", b"")) == self.worker]
            if mine and int(mine[0].get("pending", 0)) == 0:
                await self.r.xgroup_delconsumer(stream, self.ks.group, self.worker)


def dead_value(name: str, value: object) -> Any:
    """A dead letter's field as written: bytes as they are (the raw record), text as valid UTF-8,
    the reason and traceback cut (so user code's text can never make the dead letter fail)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    text = value if isinstance(value, str) else str(value)
    if name == "reason":
        text = text[:DEAD_REASON_CHARS]
    elif name == "traceback":
        text = text[-DEAD_TRACEBACK_CHARS:]
    return utf8(text)
