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
own, in chunks (:meth:`StreamBroker.commit_calls`), one such trajectory at a time, in this
worker and, through a lease in Redis, in the whole fleet (:mod:`rewardq.consumers.stage_lease`):
its staged chunks hold Redis memory until its last chunk, so two of them must not fill Redis
together.

**Bytes in flight.** Every result byte sent to Redis sits in Redis's input buffers until its
script has run, and Redis counts those buffers in its memory. :class:`ByteGate` lets at most
``2 * commit_bytes`` of results be on the wire per worker (a batch or a chunk waits for room
first, in order; one bigger than that goes alone), whatever ``concurrency`` is.

**Redis full.** A commit script Redis refuses because it is past ``maxmemory`` (refused whole,
before it ran: :mod:`rewardq.queue.scripts`) is sent again by
:class:`~rewardq.consumers.retries.RoomWaits` until it goes through: a single-call commit whole, a
chunked one from the refused chunk (its staged chunks are kept; its last chunk is never refused:
:mod:`rewardq.queue.scripts`), each for at most ``patience`` seconds: then it raises
:class:`~rewardq.consumers.retries.NoRoom`, and the worker gives the trajectory's keys an error
result of kind ``memory`` instead (the staged chunks of a chunked one are deleted first, so that
they do not hold the room those error results need).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

from rewardq.consumers.retries import NoRoom, RoomWaits
from rewardq.consumers.stage_lease import StageLease, Staging
from rewardq.queue.broker import StreamBroker
from rewardq.queue.results import EncodedResults, RewardResult
from rewardq.queue.script_runner import Call

_Item = tuple[int, str, EncodedResults, asyncio.Future[bool]]


class ByteGate:
    """At most ``limit`` bytes held at once; waiters are served in order (module doc)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self.used = 0
        self._queue: deque[tuple[int, asyncio.Future[None]]] = deque()

    @contextlib.asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        """Hold ``n`` bytes (at most ``limit``: a bigger load waits until it is alone) inside."""
        n = min(max(0, int(n)), self.limit)
        await self._acquire(n)
        try:
            yield
        finally:
            self.used -= n
            self._wake()

    async def _acquire(self, n: int) -> None:
        if not self._queue and self.used + n <= self.limit:
            self.used += n
            return
        entry = (n, asyncio.get_running_loop().create_future())
        self._queue.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():  # granted, then cancelled: give it back
                self.used -= n
            else:
                with contextlib.suppress(ValueError):
                    self._queue.remove(entry)
            self._wake()
            raise

    def _wake(self) -> None:
        while self._queue and self.used + self._queue[0][0] <= self.limit:
            n, granted = self._queue.popleft()
            if granted.done():
                continue
            self.used += n
            granted.set_result(None)


class CommitCoalescer:
    """``await commit(shard, tid, results)`` as :meth:`StreamBroker.commit`, in shared round trips."""

    def __init__(
        self, broker: StreamBroker, room: RoomWaits, patience: float | None = None, stage: StageLease | None = None
    ) -> None:
        self.broker = broker
        self.room = room
        self.stage = stage or StageLease(broker, room, room.stats)  # one chunked commit staging fleet-wide
        self.patience = patience  # seconds one write waits for room (module doc, "Redis full")
        self.gate = ByteGate(2 * broker.commit_bytes)
        self._alone = asyncio.Lock()  # one chunked trajectory at a time (module doc)
        self._queue: list[_Item] = []
        self._gathering: asyncio.Task[Any] | None = None  # the batch that takes what is queued now
        self._sending: set[asyncio.Task[Any]] = set()
        self._direct = 0  # commits sent straight from their own task, not yet answered

    async def commit(self, shard: int, tid: str, results: Sequence[RewardResult] | EncodedResults) -> bool:
        """Commit one trajectory; True when this call finished it (see :meth:`StreamBroker.commit`).

        Raises what that trajectory's encoding, its script or the round trip raised; a refusal
        for want of memory is waited out, for ``patience`` seconds (module doc).
        """
        enc = self.broker.encode(results)
        if enc.written_bytes > self.broker.commit_bytes:
            return await self._commit_alone(shard, tid, enc)
        return await self.room.retrying(
            f"the commit of {tid}", partial(self._commit_small, shard, tid, enc), self.patience
        )

    async def _commit_alone(self, shard: int, tid: str, enc: EncodedResults) -> bool:
        """A trajectory over ``commit_bytes``: its calls one after another, each retried alone."""
        self._direct += 1
        try:
            async with self._alone:
                calls = self.broker.commit_calls(shard, tid, enc)
                if len(calls) == 1:  # one key over commit_bytes: nothing staged
                    return await self.room.retrying(
                        f"the commit of {tid}", partial(self._send_call, calls[0], False), self.patience
                    )
                async with self.stage.held(shard, calls[0][1][8], f"the commit of {tid}") as lease:
                    return await self._send_chunks(tid, calls, lease)
        finally:
            self._direct -= 1

    async def _send_chunks(self, tid: str, calls: list[Call], lease: Staging) -> bool:
        """Send a chunked commit's calls in order, each waited out alone, holding the stage lease."""
        reply = False
        for i, call in enumerate(calls, 1):
            what = f"chunk {i}/{len(calls)} of the commit of {tid}"
            last = i == len(calls)
            if not last:
                await lease.staging(int(call[1][7]) + 1)
            try:
                reply = await self.room.retrying(what, partial(self._send_call, call, last), self.patience)
            except NoRoom:  # its staged chunks would hold the room its error results need
                await self.broker.discard_staged(calls[: i - 1])
                raise
        return reply

    async def _send_call(self, call: Call, last_chunk: bool) -> bool:
        async with self.gate.hold(self.broker.call_bytes(call)):
            return await self.broker.run_commit_call(call, last_chunk=last_chunk)

    async def _commit_small(self, shard: int, tid: str, enc: EncodedResults) -> bool:
        """A trajectory of at most ``commit_bytes``: alone when nothing else is out, else batched."""
        if self._gathering is None and not self._sending and not self._direct:
            # nothing queued or on the wire: send it now from this task (no extra loop turn);
            # commits that come while it is out gather into the next batch
            self._direct += 1
            try:
                async with self.gate.hold(enc.written_bytes):
                    return await self.broker.commit(shard, tid, enc)  # one EVALSHA, no pipeline
            finally:
                self._direct -= 1
        results = enc
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
            async with self.gate.hold(sum(item[2].written_bytes for item in batch)):
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
