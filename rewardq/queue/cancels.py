"""Cancelling trajectories nobody needs any more: the script call the producers make, and what
workers watch to stop scoring them.

``RewardClient.cancel(keys)`` runs ``lua/cancel.lua`` once per trajectory the keys name: unless the
trajectory has finished, every key it answers for gets a ``cancelled`` result
(:class:`~rewardq.queue.states.ResultStatus`), the trajectory ends, its recorded entries are
acknowledged and its ``done`` stream hears of it. Then the producer raises the namespace's
``<ns>:cancels`` counter, which every worker reads a few times a second (one ``GET``): when it has
moved, the worker looks up the trajectories it holds and stops scoring the cancelled ones
(:mod:`rewardq.consumers.cancels`): their judge calls in flight are aborted and their rate-limit
budget given back. A record of a cancelled trajectory that arrives later, or that a reclaim picks
up, is acknowledged and never scored (``store.lua``, ``claimable.lua``).

The producer does not know the workers' settings: the ``cancelled`` results live ``result_ttl``
(the client's setting, the workers' default unless told otherwise), and the records of a
cancelled trajectory are never kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rewardq.queue.keys import DONE_MAXLEN, Keyspace, split_key

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis


def by_trajectory(keys: Iterable[str], max_outputs: int) -> dict[str, list[int]]:
    """The output indices named per trajectory id; an index at or past ``max_outputs`` is refused
    with a ``ValueError`` naming the key (no trajectory has it)."""
    plan: dict[str, list[int]] = {}
    for key in keys:
        tid, index = split_key(key)
        if index >= max_outputs:
            raise ValueError(f"{key!r}: output index {index} is not below max_outputs={max_outputs}")
        plan.setdefault(tid, []).append(index)
    return {tid: sorted(set(indices)) for tid, indices in plan.items()}


def cancel_call(
    ks: Keyspace, tid: str, indices: list[int], *, result_ttl: float, max_outputs: int
) -> tuple[list[str], list[Any]]:
    """``(keys, args)`` of the ``cancel`` script for trajectory ``tid`` (see ``lua/cancel.lua``)."""
    shard = ks.shard_of(tid)
    keys = [ks.traj(shard, tid), ks.stream(shard), ks.waiting(shard), ks.done(shard), ks.records(shard, tid)]
    args: list[Any] = [
        ks.group,
        tid,
        ks.reward_prefix(shard),
        int(result_ttl),
        DONE_MAXLEN,
        max_outputs,
        0,  # keep_records: a cancelled trajectory's records are not kept
        len(indices),
        *indices,
    ]
    return keys, args


class CancelWatch:
    """What a worker reads to learn which of the trajectories it holds were cancelled.

    :meth:`cancelled` costs one ``GET`` of ``<ns>:cancels`` while nothing was cancelled since
    the last look, and one pipelined ``HGET status`` per held trajectory when something was.
    """

    def __init__(self, redis: AsyncRedis, ks: Keyspace) -> None:
        self.r = redis
        self.ks = ks
        self.seen: bytes | None = None

    async def cancelled(self, held: Mapping[int, Iterable[str]]) -> list[str]:
        """The trajectories of ``held`` (``{shard: [tid, ...]}``) that were cancelled, when any
        cancellation happened since the last call (else ``[]``, after one ``GET``)."""
        seq = await self.r.get(self.ks.cancels)
        if seq is None or seq == self.seen:
            return []
        self.seen = seq
        tids = [(shard, tid) for shard, group in held.items() for tid in group]
        if not tids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for shard, tid in tids:
            pipe.hget(self.ks.traj(shard, tid), "status")
        statuses = await pipe.execute()
        return [tid for (_, tid), status in zip(tids, statuses) if status == b"cancelled"]
