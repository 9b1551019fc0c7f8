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

import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from rewardq import defaults
from rewardq.queue.codec import OutputRecord, record_digest
from rewardq.queue.connection import is_cluster_client
from rewardq.queue.entries import Entry, StoreOutcome, entries_from_reply
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RewardResult, as_text, same_fields
from rewardq.queue.script_runner import ScriptRunner
from rewardq.queue.states import ResultStatus

RESULT_FIELDS = ("status", "reward_score", "reward_extra_info", "error", "worker", "manager", "scored_at", "latency_ms")
#: Bytes of entries ``claimable.lua`` reads in one call before it leaves the rest for a later pass.
CLAIMABLE_BYTE_BUDGET = 64 * 1024 * 1024


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
    """

    def __init__(
        self,
        client: Any,
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
        streams = {self.ks.stream(s): ">" for s in shards}
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
        args = [self.ks.traj_prefix(shard), self.worker, defaults.MAX_KEY_CHARS, CLAIMABLE_BYTE_BUDGET, *ids]
        ids = [_s(i) for i in await self.scripts.run("claimable", [stream], args)]
        if not ids:
            return []
        claimed_raw = await self.r.xclaim(stream, self.ks.group, self.worker, min_idle_ms, ids)
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
        conflict (contradicts stored data; the caller must :meth:`fail`).
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
            elif kind in ("leased", "conflict"):
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
    async def commit(
        self, shard: int, tid: str, results: Sequence[RewardResult], status: str = ResultStatus.OK
    ) -> bool:
        """Write every key's result, then acknowledge the trajectory's entries (atomically).

        Idempotent: a second commit of a finished trajectory only re-acknowledges.
        Returns True when this call finished it.
        """
        keys, args = self._commit_call(shard, tid, results, status)
        return bool(await self.scripts.run("commit", keys, args))

    async def commit_many(self, items: Sequence[tuple[int, str, Sequence[RewardResult]]]) -> list[Any]:
        """:meth:`commit` of several trajectories in one round trip (each still atomic on its own).

        Returns, in order, True/False as :meth:`commit` would, or the exception of that call.
        """
        calls = [self._commit_call(shard, tid, results, "ok") for shard, tid, results in items]
        return [r if isinstance(r, Exception) else bool(r) for r in await self.scripts.run_many("commit", calls)]

    def _commit_call(
        self, shard: int, tid: str, results: Sequence[RewardResult], status: str
    ) -> tuple[list[Any], list[Any]]:
        """The ``commit`` script's ``(keys, args)`` for one trajectory.

        When every key gets the same result (a manager's one dict copied to every key, the
        built-in managers' case) its fields go once, not once per key.
        """
        rows = results[:1] if all(same_fields(results[0], r) for r in results[1:]) else results
        values: list[str] = []
        encoded: dict[int, str] = {}  # per-output results may still share one extra-info dict
        for r in rows:
            js = encoded.get(id(r.reward_extra_info))
            if js is None:
                js = encoded[id(r.reward_extra_info)] = r.extra_info_json()
            h = r.to_hash(js)
            values.extend(h[f] for f in RESULT_FIELDS)
        args = [
            self.ks.group,
            tid,
            self.worker,
            self.result_ttl,
            self.done_maxlen,
            len(results),
            len(RESULT_FIELDS),
            *RESULT_FIELDS,
            len(rows),
            *values,
            self.ks.reward_prefix(shard),
            status,
            self.keep_records,
            self.max_outputs,
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
    ) -> int:
        """Finish a trajectory with an error result for all its keys; dead-letter and ack ``entry``.

        ``index`` is the output the failure is about (-1: none; digits beyond ``max_outputs`` name
        that one key only). Keys that already have a result keep it.
        """
        keys = [
            self.ks.traj(shard, tid),
            self.ks.stream(shard),
            self.ks.waiting(shard),
            self.ks.done(shard),
            self.ks.dead(shard),
        ]
        args: list[Any] = [
            self.ks.group,
            tid,
            self.ks.reward_prefix(shard),
            self.result_ttl,
            message,
            self.worker,
            str(index),
            entry.id if entry else "",
            self.done_maxlen,
            self.dead_maxlen,
            self.max_outputs,
        ]
        for k, v in (dead or {}).items():
            args.extend([k, v])
        return int(await self.scripts.run("fail", keys, args))

    async def dead_letter_entry(self, entry: Entry, dead: dict[str, Any]) -> None:
        """Dead-letter an entry that names no trajectory at all, and ack it."""
        stream = self.ks.stream(entry.shard)
        pipe = self.r.pipeline(transaction=not self.cluster)
        pipe.xadd(self.ks.dead(entry.shard), dead, maxlen=self.dead_maxlen, approximate=True)
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
        return int(await self.r.hincrby(self.ks.traj(shard, tid), "solo", by))

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
        await self.r.hset(key, mapping=mapping)
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
