"""The worker's view of Redis: every stream and script operation, nothing else.

:class:`StreamBroker` is the only place the worker talks to Redis. Each method is one
named step of the worker loop (read, reclaim, store, commit, fail, expire) or a part
that holds such steps (renew, release and heartbeat are ``broker.liveness``'s), and documents
what it guarantees. It works on one Redis and on
Redis Cluster: every multi-key call stays inside one shard's hash slot.

Reading, filing records, claiming whole trajectories and committing are its own; each other step
it hands to a part it holds. Reclaiming and the commit calls keep a method here; the endings' steps
it hands on as they are (``broker.fail`` is ``broker.endings.fail``); the notes on attempts and
liveness its callers use as the parts they are (``broker.attempts.note_retry``,
``broker.liveness.renew``):

* :class:`~rewardq.queue.reclaim.Reclaimer`: ``reclaim`` (what dead workers left pending);
* :class:`~rewardq.queue.commit_calls.CommitCalls`: encoding results into ``commit`` script calls,
  chunked past ``commit_bytes``, and the stage lease of a chunked commit;
* :class:`~rewardq.queue.attempts.AttemptNotes`: what a trajectory's hash records about its
  attempts (retries, unfinished attempts, the starts crash attribution counts);
* :class:`~rewardq.queue.endings.Endings`: ending a trajectory without an answer (``fail``,
  ``dead_letter_entry``, ``expire_incomplete``): error results, dead letters, and the dropped
  entries' blobs;
* :class:`~rewardq.queue.liveness.Liveness`: the heartbeat, registration, and lease renewal and release.

What it reads and what filing a record answers are :mod:`rewardq.queue.entries`; records that
travel as blobs or are kept by reference are read back by :mod:`rewardq.queue.blobs`, and a failing
trajectory's parked records, for its ledger rows, by :mod:`rewardq.queue.parked`; its Lua
scripts run through :class:`~rewardq.queue.script_runner.ScriptRunner` (NOSCRIPT and cluster
routing); the shard count it is built with is agreed in :mod:`rewardq.queue.meta`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError
from redis.typing import KeyT, StreamIdT

from rewardq.queue.attempts import AttemptNotes
from rewardq.queue.blobs import blob_of, kept_records, resolve_entries
from rewardq.queue.checks import MAX_OUTPUTS, MAX_RECORD_BYTES, MAX_TRAJECTORY_BYTES
from rewardq.queue.codec import OutputRecord
from rewardq.queue.commit_calls import COMMIT_BYTE_BUDGET, STAGE_LEASE_SECONDS, STAGE_TTL, CommitCalls
from rewardq.queue.connection import is_cluster_client
from rewardq.queue.digests import legacy_record_digest, record_digest
from rewardq.queue.endings import DEAD_REASON_CHARS, DEAD_TRACEBACK_CHARS, EXPIRE_BATCH, Endings, Expired, dead_value
from rewardq.queue.entries import Entry, StoreOutcome, entries_from_reply
from rewardq.queue.keys import DEAD_LETTER_BYTES, DEAD_LETTER_TTL, DEAD_MAXLEN, DONE_MAXLEN, Keyspace
from rewardq.queue.liveness import Liveness
from rewardq.queue.parked import parked_records
from rewardq.queue.reclaim import CLAIMABLE_BYTE_BUDGET, Reclaimer
from rewardq.queue.results import (
    MAX_RESULT_BYTES,
    RESULT_FIELDS,
    RESULT_TTL,
    EncodedResults,
    RewardResult,
    as_text,
)
from rewardq.queue.script_runner import Call, ScriptRunner
from rewardq.queue.states import ResultStatus

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

# the names of the parts' modules stay importable from here, where the worker's callers find them
__all__ = [
    "CLAIMABLE_BYTE_BUDGET",
    "COMMIT_BYTE_BUDGET",
    "DEAD_REASON_CHARS",
    "DEAD_TRACEBACK_CHARS",
    "EXPIRE_BATCH",
    "RESULT_FIELDS",
    "STAGE_LEASE_SECONDS",
    "STAGE_TTL",
    "Expired",
    "StreamBroker",
    "dead_value",
]

#: Seconds a trajectory stays leased to its scorer without renewal.
LEASE_SECONDS = 30.0
#: Seconds a trajectory may wait for its missing outputs before every key gets an error.
INCOMPLETE_TIMEOUT = 600.0
#: Seconds the records of an ended trajectory (scored or failed) are kept for ``rewardq inspect`` and
#: ``rewardq dead-letters retry``; 0 deletes them as soon as the result is written. Off by default:
#: kept records cost as much memory as the traffic of that many seconds.
KEEP_RECORDS = 0.0


#: Largest record ``store`` copies into its trajectory hash. A larger one stays in its stream entry
#: and the hash names that entry (``lua/store.lua``): a script copying tens of MB holds every
#: client of Redis for up to a second, a reference costs a few bytes.
STORE_INLINE_BYTES = 1024 * 1024


_s = as_text


class StreamBroker:
    """Stream and script operations for one worker.

    Args:
        client: a ``redis.asyncio`` client (or cluster client) with ``decode_responses=False``.
        ks: the keyspace (namespace, shard count, group).
        worker: this worker's consumer name (unique in the group).
        life: this process's life under that name (drawn at random when not given): the leases it
            takes carry it (``lease_life``), so a process started again under the same name (a
            StatefulSet pod, a systemd unit) takes its dead predecessor's leases over as new
            attempts (``take_lease`` in ``lua/common.lua``), while one process filing several
            entries of a trajectory stays one attempt.
        result_ttl: seconds results and finished trajectories live; 0 keeps them forever.
        lease_seconds: how long a trajectory stays leased without renewal.
        incomplete_timeout: seconds a trajectory may wait for missing outputs.
        max_outputs: the bound every script is given for a trajectory's outputs (never a record's).
        keep_records: seconds an ended trajectory's records are kept (0: deleted when it ends).
        max_trajectory_bytes: the most a trajectory's stored records may take (``store`` refuses more).
        max_record_bytes: the most one record may take: a record's blob (:mod:`rewardq.queue.blobs`)
            is read no further.
        max_result_bytes: the most one key's result may take (results are checked before a commit).
        commit_bytes: the most one ``commit`` script call writes (larger trajectories go in chunks).
        dead_letter_bytes, dead_letter_ttl: the bounds of each shard's dead-letter stream, beside
            ``dead_maxlen`` entries: bytes, and seconds a dead letter is kept (``add_dead`` in
            ``lua/common.lua``).
    """

    def __init__(
        self,
        client: AsyncRedis,
        ks: Keyspace,
        *,
        worker: str,
        life: str | None = None,
        result_ttl: float = RESULT_TTL,
        lease_seconds: float = LEASE_SECONDS,
        incomplete_timeout: float = INCOMPLETE_TIMEOUT,
        done_maxlen: int = DONE_MAXLEN,
        dead_maxlen: int = DEAD_MAXLEN,
        keep_records: float = KEEP_RECORDS,
        max_outputs: int = MAX_OUTPUTS,
        max_trajectory_bytes: int = MAX_TRAJECTORY_BYTES,
        max_record_bytes: int = MAX_RECORD_BYTES,
        max_result_bytes: int = MAX_RESULT_BYTES,
        commit_bytes: int = COMMIT_BYTE_BUDGET,
        dead_letter_bytes: int = DEAD_LETTER_BYTES,
        dead_letter_ttl: float = DEAD_LETTER_TTL,
    ) -> None:
        self.r = client
        self.ks = ks
        self.worker = worker
        self.life = life or os.urandom(8).hex()
        self.result_ttl = int(result_ttl)
        self.lease_seconds = lease_seconds
        self.incomplete_timeout = incomplete_timeout
        self.done_maxlen = done_maxlen
        self.dead_maxlen = dead_maxlen
        self.keep_records = keep_records
        self.max_outputs = int(max_outputs)
        self.max_trajectory_bytes = int(max_trajectory_bytes)
        self.max_record_bytes = int(max_record_bytes)
        self.max_result_bytes = int(max_result_bytes)
        self.commit_bytes = int(commit_bytes)
        self.dead_letter_bytes = int(dead_letter_bytes)
        self.dead_letter_ttl = float(dead_letter_ttl)
        self.cluster = is_cluster_client(client)
        self.scripts = ScriptRunner(client)
        # the parts each step beyond reading, filing and finishing is handed to
        self.reclaimer = Reclaimer(client, ks, self.scripts, worker)
        self.calls = CommitCalls(
            client,
            ks,
            self.scripts,
            worker,
            self.cluster,
            result_ttl=self.result_ttl,
            done_maxlen=done_maxlen,
            keep_records=keep_records,
            max_outputs=self.max_outputs,
            max_result_bytes=self.max_result_bytes,
            commit_bytes=self.commit_bytes,
        )
        self.endings = Endings(
            client,
            ks,
            self.scripts,
            worker,
            result_ttl=self.result_ttl,
            incomplete_timeout=incomplete_timeout,
            done_maxlen=done_maxlen,
            dead_maxlen=dead_maxlen,
            keep_records=keep_records,
            max_outputs=self.max_outputs,
            dead_letter_bytes=self.dead_letter_bytes,
            dead_letter_ttl=self.dead_letter_ttl,
        )
        # ending a trajectory without an answer is the Endings' own, signature and all: the broker
        # hands its callers the very methods (fail, dead_letter_entry, expire_incomplete)
        self.fail = self.endings.fail
        self.dead_letter_entry = self.endings.dead_letter_entry
        self.expire_incomplete = self.endings.expire_incomplete
        self.attempts = AttemptNotes(client, ks, self.scripts, worker, self.cluster, self.life)
        self.liveness = Liveness(client, ks, self.scripts, worker, lease_seconds, self.life)

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
        entries = entries_from_reply(resp, self.ks)
        await resolve_entries(self.r, self.ks, entries, self.max_record_bytes)  # blobs' records read in pieces
        return entries

    async def reclaim(self, shard: int, min_idle_ms: int, count: int, trajectories: int | None = None) -> list[Entry]:
        """Take over entries other (dead) workers left pending for ``min_idle_ms``, of at most
        ``trajectories`` trajectories, each with its delivery count (:meth:`Reclaimer.reclaim
        <rewardq.queue.reclaim.Reclaimer.reclaim>`), blobs' records read in pieces."""
        entries = await self.reclaimer.reclaim(shard, min_idle_ms, count, trajectories)
        await resolve_entries(self.r, self.ks, entries, self.max_record_bytes)
        return entries

    # -- store ---------------------------------------------------------------------------
    async def store(self, items: Sequence[tuple[Entry, OutputRecord, bytes]]) -> list[StoreOutcome]:
        """File each record in its trajectory hash (one pipelined round trip).

        For each record, exactly one of: parked (acked, waiting for more outputs),
        complete (this worker holds the lease and must score, then :meth:`commit`; with its
        ``attempts`` and, after an attempt that never finished, its ``solo`` and ``shared`` starts),
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
                        len(payload),
                        STORE_INLINE_BYTES,
                        blob_of(self.ks, entry) or "",
                        legacy_record_digest(payload),  # what a trajectory filed by an earlier version holds
                        self.life,
                    ],
                )
            )
        replies = await self.scripts.run_many("store", calls)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        shard_replies = [(entry.shard, reply) for (entry, _, _), reply in zip(items, replies)]
        payloads = await kept_records(self.r, self.ks, shard_replies, self.max_record_bytes)
        out = []
        for (entry, rec, _), reply, got in zip(items, replies, payloads):
            kind = _s(reply[0])
            kept = [p for p in got if p is not None]
            if kind == "complete" and len(kept) < len(got):
                # its records were deleted between the two calls: the trajectory ended meanwhile
                # (cancelled, or ended by another worker after this one's lease ran out)
                out.append(StoreOutcome("done", entry, rec, detail="its records are gone: it ended meanwhile"))
            elif kind == "complete":
                out.append(
                    StoreOutcome(
                        kind,
                        entry,
                        rec,
                        payloads=kept,
                        attempts=int(reply[2]),
                        solo=int(reply[3]),
                        shared=int(reply[4]),
                    )
                )
            elif kind == "conflict":
                late = _s(reply[2]) if len(reply) > 2 else ""
                out.append(StoreOutcome(kind, entry, rec, detail=_s(reply[1]), late=late))
            elif kind in ("leased", "toolarge"):
                out.append(StoreOutcome(kind, entry, rec, detail=_s(reply[1])))
            else:
                out.append(StoreOutcome(kind, entry, rec, detail=_s(reply[1]) if len(reply) > 1 else ""))
        return out

    async def memory(self) -> tuple[int, int]:
        """Redis's ``used_memory`` and ``maxmemory`` in bytes (``(0, 0)`` when it will not say)."""
        try:
            info = await self.r.info("memory")
        except Exception:  # noqa: BLE001 - INFO refused (ACL) or a cluster's answer per node: figures unknown
            return 0, 0
        return int(info.get("used_memory", 0) or 0), int(info.get("maxmemory", 0) or 0)

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
                    self.life,
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

    async def parked(self, shard: int, tid: str, skip: Collection[int] = ()) -> dict[int, bytes]:
        """The records of trajectory ``tid`` parked in its hash, by index, but those of ``skip``: read
        back for the ledger rows of its failure only, within ``max_outputs`` fields and a byte bound
        (:func:`~rewardq.queue.parked.parked_records`)."""
        return await parked_records(self.r, self.ks.traj(shard, tid), max_outputs=self.max_outputs, skip=skip)

    # -- finish: the commit calls are built and run by CommitCalls (rewardq.queue.commit_calls) ---
    def encode(self, results: Sequence[RewardResult] | EncodedResults) -> EncodedResults:
        """``results`` checked and encoded for a commit (:meth:`CommitCalls.encode`)."""
        return self.calls.encode(results)

    def commit_calls(self, shard: int, tid: str, enc: EncodedResults, status: str = ResultStatus.OK) -> list[Call]:
        """The ``commit`` script calls of one trajectory, in order (:meth:`CommitCalls.commit_calls`)."""
        return self.calls.commit_calls(shard, tid, enc, status)

    async def run_commit_call(self, call: Call, *, last_chunk: bool = False) -> bool:
        """Run one of :meth:`commit_calls` (:meth:`CommitCalls.run_commit_call`)."""
        return await self.calls.run_commit_call(call, last_chunk=last_chunk)

    @staticmethod
    def call_bytes(call: Call) -> int:
        """Bytes of the values a commit call carries (:meth:`CommitCalls.call_bytes`)."""
        return CommitCalls.call_bytes(call)

    async def discard_staged(self, calls: Sequence[Call]) -> None:
        """Delete what the stage calls among ``calls`` wrote (:meth:`CommitCalls.discard_staged`)."""
        await self.calls.discard_staged(calls)

    async def stage_lease(
        self, shard: int, op: str, token: str, *, prefix: str = "", staged: int = 0
    ) -> tuple[bool, str]:
        """Take, renew or release the one chunked commit's stage lease (:meth:`CommitCalls.stage_lease`)."""
        return await self.calls.stage_lease(shard, op, token, prefix=prefix, staged=staged)

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
        reply = False
        for i, call in enumerate(calls, 1):  # one at a time: at most one chunk's bytes in flight
            reply = await self.run_commit_call(call, last_chunk=i == len(calls) > 1)
        return reply

    async def commit_many(
        self, items: Sequence[tuple[int, str, Sequence[RewardResult] | EncodedResults]]
    ) -> list[object]:
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
