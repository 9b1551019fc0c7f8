"""Commits of trajectories scored in the same event-loop turn travel to Redis together.

A read batch of 256 entries holds ~50 whole trajectories; their scoring tasks run one after
another in one turn of the event loop and each ends in a commit. Sent one by one, that is
~50 round trips, each paying redis-py's per-command cost (a pool checkout, packing, a read).
:class:`CommitCoalescer` queues them and sends everything queued in one turn as one pipeline
of ``commit`` scripts (:meth:`StreamBroker.commit_many`). Each script is still atomic on its
own: write every key's result, then acknowledge. A commit that finds nothing queued or on the
wire goes out at once from its own task (at a low rate that is every commit: nothing waits for
company); the ones that arrive while it is out are sent together in the next turn.

Every commit arrives checked and encoded (:class:`~rewardq.queue.results.EncodedResults`): a
result that cannot be stored has already failed its own trajectory, so nothing in a batch can
fail the others. A batch carries at most the broker's ``commit_bytes`` of results per round trip
(the rest go in the next one), and a trajectory too large for one script call is sent on its
own, in chunks (:meth:`StreamBroker.commit`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rewardq.queue.broker import StreamBroker
from rewardq.queue.results import EncodedResults, RewardResult

_Item = tuple[int, str, EncodedResults, asyncio.Future[bool]]


class CommitCoalescer:
    """``await commit(shard, tid, results)`` as :meth:`StreamBroker.commit`, in shared round trips."""

    def __init__(self, broker: StreamBroker) -> None:
        self.broker = broker
        self._queue: list[_Item] = []
        self._gathering: asyncio.Task[Any] | None = None  # the batch that takes what is queued now
        self._sending: set[asyncio.Task[Any]] = set()
        self._direct = 0  # commits sent straight from their own task, not yet answered

    async def commit(self, shard: int, tid: str, results: Sequence[RewardResult] | EncodedResults) -> bool:
        """Commit one trajectory; True when this call finished it (see :meth:`StreamBroker.commit`).

        Raises what that trajectory's encoding, its script or the round trip raised.
        """
        results = self.broker.encode(results)
        large = results.written_bytes > self.broker.commit_bytes
        if large or (self._gathering is None and not self._sending and not self._direct):
            # nothing queued or on the wire: send it now from this task (no extra loop turn);
            # commits that come while it is out gather into the next batch
            self._direct += 1
            try:
                return await self.broker.commit(shard, tid, results)  # one EVALSHA, no pipeline
            finally:
                self._direct -= 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._queue.append((shard, tid, results, future))
        if self._gathering is None:
            # a task's first step runs in the next turn of the loop: by then every task that
            # was ready in this turn has queued its commit too
            task = loop.create_task(self._send(), name="commit-batch")
            self._gathering = task
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        return await future

    async def _send(self) -> None:
        queued = [item for item in self._queue if not item[3].done()]  # a cancelled waiter drops out
        self._queue = []
        self._gathering = None  # commits queued from now on form the next batch
        batches = self._by_budget(queued)
        try:
            for batch in batches:
                await self._send_batch(batch)
        except asyncio.CancelledError:
            for *_, future in (item for batch in batches for item in batch):
                future.cancel()
            raise

    def _by_budget(self, items: list[_Item]) -> list[list[_Item]]:
        """``items`` in consecutive batches of at most ``commit_bytes`` of results (at least one each)."""
        budget = self.broker.commit_bytes
        batches: list[list[_Item]] = []
        size = 0
        for item in items:
            n = item[2].written_bytes
            if not batches or size + n > budget:
                batches.append([])
                size = 0
            batches[-1].append(item)
            size += n
        return batches

    async def _send_batch(self, batch: list[_Item]) -> None:
        try:
            replies: list[Any] = await self.broker.commit_many([(s, t, r) for s, t, r, _ in batch])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the round trip failed: every waiter decides (retry or not) itself
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (*_, future), reply in zip(batch, replies):
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def drain(self) -> None:
        """Wait for the commits already sent (the worker calls this before it closes Redis)."""
        while self._sending or self._direct:
            await asyncio.gather(*self._sending, return_exceptions=True)
            if self._direct:
                await asyncio.sleep(0.001)
