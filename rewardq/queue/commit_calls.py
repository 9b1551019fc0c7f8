"""The ``commit`` script calls of a trajectory: its results encoded, cut into calls of at most
``commit_bytes``, run one at a time, and the stage lease that lets one chunked commit stage at a time.

:class:`~rewardq.queue.broker.StreamBroker` holds one :class:`CommitCalls` and hands ``encode``,
``commit_calls``, ``run_commit_call``, ``call_bytes``, ``discard_staged`` and ``stage_lease`` to it;
its ``commit`` and ``commit_many`` run the calls built here. A trajectory whose results fit in
``commit_bytes`` is one call; a larger one is staged chunk by chunk and made visible, with the
acknowledgement, by its last call (``lua/commit.lua``).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RESULT_FIELDS, EncodedResults, RewardResult, as_text, encode_results
from rewardq.queue.script_runner import Call, ScriptRunner
from rewardq.queue.states import ResultStatus

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

#: Bytes one ``commit`` script call writes at most (a single key's result larger than this, up to
#: ``max_result_bytes``, goes alone). Redis checks ``maxmemory`` only before a script starts, and a
#: script holds every client while it runs: 4 MiB is written in a few ms, is all one call can take
#: Redis past its cap (the last chunk of a chunked commit; ``rewardq.queue.scripts``), and a
#: trajectory with more results is committed in chunks (see ``lua/commit.lua``).
COMMIT_BYTE_BUDGET = 4 * 1024 * 1024
#: Seconds the staged results of a chunked commit live, should its worker die between the chunks.
STAGE_TTL = 600
#: Seconds a chunked commit's stage lease lives without renewal (``lua/stage.lua``): then its holder
#: counts as dead and the next taker deletes what it staged.
STAGE_LEASE_SECONDS = 30.0

_s = as_text


@dataclass
class CommitCalls:
    """Builds and runs the ``commit`` script calls of the consumer ``worker`` (the broker's bounds)."""

    r: AsyncRedis
    ks: Keyspace
    scripts: ScriptRunner
    worker: str
    cluster: bool
    result_ttl: int
    done_maxlen: int
    keep_records: float
    max_outputs: int
    max_result_bytes: int
    commit_bytes: int

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

    async def discard_staged(self, calls: Sequence[Call]) -> None:
        """Delete the results the stage calls among ``calls`` (of :meth:`commit_calls`) wrote: a
        chunked commit given up (``DEL`` is allowed past ``maxmemory``)."""
        keys = [f"{a[8]}{i}" for _, a in calls if a[8] for i in range(int(a[6]), int(a[7]) + 1)]
        for at in range(0, len(keys), 1000):
            await self.r.delete(*keys[at : at + 1000])

    async def stage_lease(
        self, shard: int, op: str, token: str, *, prefix: str = "", staged: int = 0
    ) -> tuple[bool, str]:
        """Take, renew or release the lease of the one chunked commit that may stage results at a
        time (``lua/stage.lua``): one per Redis (shard 0's key), one per shard on a cluster, where
        each shard's keys may live on their own node. ``prefix`` and ``staged``: the caller's staged
        keys (what a taker deletes should the caller die). Returns ``(held, detail)``: for a refused
        take, the holder's token; for a take, how many stale staged keys it deleted."""
        key = self.ks.stage_lease(shard if self.cluster else 0)
        args = [op, token, int(STAGE_LEASE_SECONDS * 1000), prefix, staged, self.max_outputs, STAGE_TTL]
        ok, detail = await self.scripts.run("stage", [key], args)
        return bool(ok), _s(detail)

    async def run_commit_call(self, call: Call, *, last_chunk: bool = False) -> bool:
        """Run one of :meth:`commit_calls` (True: it finished, or staged, its keys); ``last_chunk``:
        the last call of a trajectory committed in several, which Redis runs past ``maxmemory``
        (``commit_last``, :mod:`rewardq.queue.scripts`)."""
        keys, args = call
        return bool(await self.scripts.run("commit_last" if last_chunk else "commit", keys, args))

    @staticmethod
    def call_bytes(call: Call) -> int:
        """Bytes of the values a commit call carries (what it costs Redis's input buffer, near enough)."""
        return sum(len(a) for a in call[1] if isinstance(a, (bytes, str)))

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
