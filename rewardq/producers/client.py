"""The rollout side, blocking flavour: push outputs, read and wait for rewards.

>>> client = RewardClient.from_url("redis://127.0.0.1:6379/0", namespace="rewardq")  # doctest: +SKIP
>>> keys = client.put_trajectory("uid-1", "s0", outputs, sample)                       # doctest: +SKIP
>>> rewards = client.wait_rewards(keys, timeout=60)                                     # doctest: +SKIP
>>> rewards[keys[-1]].reward_score                                                      # doctest: +SKIP
1.0
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rewardq.errors import RewardTimeout
from rewardq.producers.core import (
    FULL_RECHECK,
    SWEEP_INTERVAL,
    SWEEP_MAX,
    WAIT_TIMEOUT,
    ClientBase,
    Name,
    Output,
    PutCall,
    backlog_lengths,
    output_count,
    settings_from_kwargs,
    split_replies,
)
from rewardq.producers.reading import (
    ReadPlan,
    Waiter,
    check_keys,
    ended,
    finished_tids,
    keys_by_trajectory,
    parse_results,
    parse_trajectory,
    sweep_share,
)
from rewardq.queue import scripts
from rewardq.queue.blobs import write_blob
from rewardq.queue.cancels import by_trajectory, cancel_call
from rewardq.queue.clients import SyncRedis
from rewardq.queue.connection import REDIS_URL, ResponseError, connect_sync
from rewardq.queue.keys import NAMESPACE, Keyspace
from rewardq.queue.results import RewardResult


class RewardClient(ClientBase[SyncRedis]):
    """Blocking client for producers (agent loops) and trainers.

    Args:
        redis: a ``redis.Redis`` / ``redis.RedisCluster`` client (``decode_responses=False``).
        settings: see :class:`~rewardq.producers.core.ClientSettings`; keyword arguments
            override its fields.
    """

    @classmethod
    def from_url(cls, url: str = REDIS_URL, namespace: str = NAMESPACE, **kwargs: object) -> RewardClient:
        """Connect to ``url`` (see :mod:`rewardq.queue.connection` for cluster and TLS URLs)."""
        settings = settings_from_kwargs(namespace, kwargs)
        return cls(connect_sync(url, cluster=settings.cluster, **kwargs), settings)

    # -- plumbing -------------------------------------------------------------------------
    @property
    def keyspace(self) -> Keyspace:
        if self._ks is None:
            probe = Keyspace(self.settings.namespace)
            have = self.r.hget(probe.meta, "shards")  # read first: past maxmemory, HSETNX is refused
            if have is None:
                self.r.hsetnx(probe.meta, "shards", self.settings.shards or 1)
                have = self.r.hget(probe.meta, "shards")
            return self._keyspace_from_meta(have)
        return self._ks

    def close(self) -> None:
        self.r.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _gate(self, shards: Iterable[int]) -> None:
        for shard in set(shards) & self._backlog.full:
            stream = self.keyspace.stream(shard)
            wait = self._backlog.waiting(shard)
            while (delay := wait.after(int(self.r.xlen(stream)))) is not None:
                time.sleep(delay)

    def _send(self, call: PutCall) -> None:
        """Send a call's puts: the blobs of its large records first, piece by piece
        (:mod:`rewardq.queue.blobs`), then its entries (see :meth:`ClientBase._send_pipeline`: all or
        nothing). A call that fails deletes the blobs it wrote."""
        blobs = [p.blob for p in call.puts if p.blob is not None]
        if blobs:  # a producer held back by the backlog writes no blob meanwhile
            self._gate(p.shard for p in call.puts)
        try:
            for name, data in blobs:
                write_blob(self.r, name, data, self.settings.blob_ttl)
            self._send_entries(call)
        except BaseException:
            with contextlib.suppress(Exception):  # Redis refusing or gone: the blobs' TTL ends them
                for name, _ in blobs:
                    self.r.delete(name)
            raise

    def _send_entries(self, call: PutCall) -> None:
        puts = call.puts
        self._gate(p.shard for p in puts)
        pipe, shards, atomic = self._send_pipeline(self.keyspace, puts)
        call.written = None
        if atomic:
            try:
                replies = pipe.execute()
            except ResponseError:  # Redis refused it: MULTI/EXEC discarded every XADD
                call.written = False
                raise
        else:
            replies = pipe.execute(raise_on_error=False)
            failure, added = split_replies(puts, replies)
            if failure is not None:
                for shard, ids in added.items():
                    self.r.xdel(self.keyspace.stream(shard), *ids)
                call.written = False
                raise failure
        self._backlog.note_all(shards, backlog_lengths(replies[len(puts) :]))

    # -- producing ---------------------------------------------------------------------------
    def put_output(
        self,
        uid: Name,
        session_id: Name,
        index: int,
        output: Output,
        sample: Mapping[str, object] | None = None,
        final: bool = False,
    ) -> str:
        """Push one output of a trajectory; returns its key ``<uid>_<session_id>_<index>``.

        ``output`` is a dict (or verl ``AgentLoopOutput``-like object) with ``prompt_ids``,
        ``response_ids`` and optionally ``response_mask``, ``response_logprobs``,
        ``num_turns``, ``extra_fields``, ``reward_score``. Mark the last output ``final=True``.
        Raises RecordError naming the bad field, and a :class:`~rewardq.errors.PutError`
        (:class:`~rewardq.errors.RedisOutOfMemory`, :class:`~rewardq.errors.RedisTimeout`,
        :class:`~rewardq.errors.RedisConnectionLost`) when Redis fails the put; the outputs put by
        earlier calls stay queued, and putting the same output again is safe.
        """
        call = PutCall("put_output", uid, session_id, self, index=index)
        with call.errors():
            call.puts = [self._prepare_output(self.keyspace, uid, session_id, index, output, sample, final)]
            self._send(call)
        return call.puts[0].key

    def put_trajectory(
        self, uid: Name, session_id: Name, outputs: Sequence[Output], sample: Mapping[str, object] | None = None
    ) -> list[str]:
        """Push all outputs of a trajectory at once (the last is final); returns their keys.

        All or nothing: a trajectory over ``max_trajectory_bytes`` or with a bad output raises
        RecordError before anything is sent, and when Redis refuses one of the outputs none of them
        stays queued (a :class:`~rewardq.errors.PutError` says so).
        """
        call = PutCall("put_trajectory", uid, session_id, self, count=output_count(outputs))
        with call.errors():
            call.puts = self._prepare_trajectory(self.keyspace, uid, session_id, outputs, sample)
            self._send(call)
        return call.keys

    # -- cancelling ----------------------------------------------------------------------------
    def cancel(self, keys: Iterable[str]) -> int:
        """Drop the trajectories of ``keys``: nobody needs their rewards any more.

        Each trajectory a key names that has not finished ends at once: every key it answers for
        gets a result with ``status="cancelled"`` (no reward, no failure), and a worker scoring it
        stops within a fraction of a second, aborting its judge calls in flight and giving their
        rate-limit budget back; if it waits in the queue, it is never scored (nor by a reclaim).
        A trajectory that finished keeps its results. Returns how many keys got a ``cancelled``
        result (:mod:`rewardq.queue.cancels`).
        """
        plan = by_trajectory(check_keys(keys), self.settings.max_outputs)
        if not plan:
            return 0
        ks = self.keyspace
        script = self.r.register_script(scripts.source("cancel"))
        written = 0
        for tid, indices in plan.items():
            k, a = cancel_call(
                ks, tid, indices, result_ttl=self.settings.result_ttl, max_outputs=self.settings.max_outputs
            )
            written += int(script(keys=k, args=a))
        self.r.incr(ks.cancels)
        return written

    # -- results -------------------------------------------------------------------------------
    def get_rewards(self, keys: Iterable[str]) -> dict[str, RewardResult | None]:
        """The results there are now: ``{key: RewardResult or None}``, in the order given (read in
        round trips of bounded size, :class:`~rewardq.producers.reading.ReadPlan`)."""
        keys = check_keys(keys)
        groups = keys_by_trajectory(keys)
        if len(groups) > ReadPlan.FIRST:  # many trajectories: the bounded reads of the result hashes
            return self._get_reward_hashes(keys)
        got: dict[str, RewardResult | None] = {}
        rest: list[str] = []
        hashes = self._trajectory_pipeline(self.keyspace, groups).execute()
        for tkeys, h in zip(groups.values(), hashes):
            found, missing = parse_trajectory(tkeys, h)
            got.update(found)
            rest += missing
        if rest:
            got.update(self._get_reward_hashes(rest))
        return {k: got.get(k) for k in keys}

    def _get_reward_hashes(self, keys: list[str]) -> dict[str, RewardResult | None]:
        """The results of ``keys`` from their own hashes (round trips of bounded size)."""
        out: dict[str, RewardResult | None] = {}
        plan = ReadPlan(keys)
        for chunk in plan:
            hashes = self._reward_pipeline(self.keyspace, chunk).execute()
            plan.took(hashes)
            out.update(parse_results(chunk, hashes))
        return out

    def get_reward(self, key: str) -> RewardResult | None:
        return self.get_rewards([key])[key]

    def wait_rewards(self, keys: Iterable[str], timeout: float = WAIT_TIMEOUT) -> dict[str, RewardResult]:
        """Block until every key has a result; ``{key: RewardResult}`` in the order given.

        Raises RewardTimeout (a TimeoutError) naming the keys still missing.
        """
        w = Waiter(check_keys(keys), timeout)
        ks = self.keyspace
        shards = sorted({ks.shard_of_key(k) for k in w.keys})
        # where each done stream ends now, then the results already there
        pipe = self.r.pipeline(transaction=False)
        for s in shards:
            pipe.xrevrange(ks.done(s), count=1)
        last = {s: (got[0][0] if got else b"0-0") for s, got in zip(shards, pipe.execute())}
        w.absorb(self.get_rewards(w.keys))
        sweep_at = time.monotonic() + SWEEP_INTERVAL
        swept = 0  # where the next sweep starts among the trajectories still missing keys
        full_at = time.monotonic() + FULL_RECHECK
        while w.missing:
            remaining = w.remaining()
            if remaining <= 0:
                raise RewardTimeout(w.missing, timeout)
            tids = self._wait_done(last, min(remaining, 1.0))
            now = time.monotonic()
            if now >= full_at:  # every key still missing, whatever its trajectory's state says
                full_at, sweep_at = now + FULL_RECHECK, now + SWEEP_INTERVAL
                recheck = w.missing
            elif now >= sweep_at:  # and those whose trajectory ended without a done entry seen
                sweep_at = now + SWEEP_INTERVAL
                share, swept = sweep_share(list(keys_by_trajectory(w.missing)), swept, SWEEP_MAX)
                recheck = w.missing_for(tids | self._ended(share))
            else:
                recheck = w.missing_for(tids)
            if recheck:
                w.absorb(self.get_rewards(recheck))
        return w.ordered()

    def _ended(self, tids: list[str]) -> set[str]:
        """The trajectories among ``tids`` whose hash says they have ended."""
        return set(ended(tids, self._state_pipeline(self.keyspace, tids).execute()))

    def _wait_done(self, last: dict[int, bytes], timeout: float) -> set[str]:
        """Block on the ``done`` streams for up to ``timeout``; returns the finished trajectory ids."""
        return set(self.read_done(last, int(timeout * 1000)))

    def read_done(self, last: dict[int, bytes], block_ms: int) -> list[str]:
        """Trajectories finished after the ids in ``last`` (shard -> done-stream id), waiting up to
        ``block_ms``; advances ``last``. On a cluster each shard is read in turn (one XREAD cannot
        span slots), sharing the wait between them."""
        ks = self.keyspace
        ms = max(1, block_ms)
        if self.cluster and len(last) > 1:
            resp: list[Any] = []
            for s in list(last):
                resp += self.r.xread({ks.done(s): last[s]}, block=max(1, ms // len(last))) or []
        else:
            resp = self.r.xread({ks.done(s): i for s, i in last.items()}, block=ms) or []
        return finished_tids(ks, resp, last)
