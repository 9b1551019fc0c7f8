"""Reading: pull batches with ``XREADGROUP`` and hand them on, through Redis outages.

:class:`StreamReader` is a collaborator of :class:`~rewardq.consumers.worker.Worker`: it is
given the broker, the batch settings, the worker's stop and capacity events, how many more trajectories the
worker may take and the function that handles a batch, and runs one read loop per group of shards
(:func:`read_groups`).

**Entries per read.** A read asks for no more entries than the worker has room for trajectories
(:meth:`~rewardq.consumers.inflight.InFlightTable.room`; an entry completes at most one), split
between the read loops, so the worker never holds more than its bound however large ``batch_size``
is: a backlog is shared by the fleet's workers instead of going whole to the first one that reads.
Trajectories of several outputs then take more reads than one, each a round trip.

A batch that fails on a Redis outage (after the connection's own retries, see
:mod:`rewardq.queue.retry`) is not handled again here: its entries stay pending and are
reclaimed after ``claim_idle``. The loop pauses by the policy's backoff and reads on. So does a
batch one of whose commands Redis refused past ``maxmemory`` (the scripts that file records are
allowed past it; a refusal of anything else is waited out with the backoff of
:class:`~rewardq.consumers.retries.RoomWaits`, counted in ``redis_full``, never a crash). A
vanished consumer group is created again; a refused permission and any other error end the
loop (the worker then stops and says why).

**A trajectory cut short by a read.** A producer sends a trajectory's outputs in one transaction,
so they sit together in the stream, and a read that ends inside one leaves the rest to the next
read. When a shard's stream gives a read all it asked for, the batch holds back that shard's
trailing partial trajectory (:func:`~rewardq.consumers.intake.trailing_partials`; at most 64
records and 16 MiB of them, past which they are filed as they come) and the next
read, sent at once and without blocking, brings the rest: the trajectory is then claimed whole (one
script) instead of filed record by record. Held-back records are filed by ``store``, as any partial
trajectory, as soon as no read follows at once: the next read finds nothing or less than it asked,
the worker has no room (``capacity`` clear), or it stops. A read never asks for more because of
them (an entry still completes at most one trajectory), and a batch that fails leaves them pending
with its own entries, to be reclaimed after ``claim_idle``.

**Bytes per read.** Redis builds a read's whole reply while every other client waits, and
``XREADGROUP`` can only be bounded in entries. So a loop sizes each read by the entries it last
read: ``READ_BYTES`` over their mean size, at most ``batch_size`` and at least one (a read that
returns nothing keeps the count: the next entries are likely of the same producer). Ordinary
records (tens of KB) read ``batch_size`` at a time; 31 MB records one at a time, instead of a
reply of hundreds of MB.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence

from rewardq.consumers.intake import Filed
from rewardq.consumers.retries import RoomWaits
from rewardq.queue.broker import StreamBroker
from rewardq.queue.connection import being_cancelled, is_out_of_memory, refusals_named
from rewardq.queue.entries import Entry
from rewardq.queue.retry import backoff_delay, is_transient

#: Longest pause (seconds) of the worker's reader after failed reads in a row.
READ_BACKOFF_CAP = 5.0


logger = logging.getLogger("rewardq.worker")

#: Bytes of records one read aims at (module doc, "Bytes per read").
READ_BYTES = 16 * 1024 * 1024


def full_streams(entries: list[Entry], asked: int) -> set[int]:
    """The shards whose stream gave a read all it asked for (``asked`` is per stream): more is
    likely to follow at once there."""
    return {shard for shard, n in Counter(e.shard for e in entries).items() if n >= asked}


def next_count(entries: list[Entry], batch_size: int, count: int) -> int:
    """Entries to ask for next, after a read of ``count`` that returned ``entries`` (module doc); an
    empty read says nothing of the sizes to come: the count stays."""
    if not entries:
        return count
    mean = sum(len(e.data) if isinstance(e.data, (bytes, bytearray)) else 0 for e in entries) / len(entries)
    return max(1, min(batch_size, int(READ_BYTES // max(mean, 1.0))))


def read_groups(shards: int, cluster: bool) -> list[list[int]]:
    """The shards each read loop covers: all in one call on one Redis, one per loop on a cluster
    (the cluster client refuses an ``XREADGROUP`` over streams in different slots)."""
    return [[s] for s in range(shards)] if cluster else [list(range(shards))]


def is_nogroup(exc: BaseException) -> bool:
    """The group or stream vanished (deleted by an operator, or a Redis without persistence restarted)."""
    text = str(exc)
    return "NOGROUP" in text or "UNBLOCKED" in text


class StreamReader:
    """The worker's read loops (see the module doc).

    Args:
        broker: the worker's gateway to Redis.
        handle: called with every non-empty batch; the loop waits for it before it reads again.
        stopping: set when the worker stops; no read starts after it.
        capacity: set while the worker can take more trajectories; a read waits for it.
        openings: how many more trajectories the worker may take now; a read asks for no more
            entries than its loop's share of them (module doc, "Entries per read").
        loops: how many read loops share the ``openings``.
        batch_size: entries per stream and read.
        block_ms: how long a read waits for entries (None: forever).
        namespace, redis_url: named in the error when Redis refuses a permission.
        room: waits out a batch Redis refused past ``maxmemory`` (module doc).
    """

    def __init__(
        self,
        broker: StreamBroker,
        *,
        handle: Callable[[list[Entry], Sequence[Filed], Collection[int]], Awaitable[list[Filed]]],
        stopping: asyncio.Event,
        capacity: asyncio.Event,
        openings: Callable[[], int],
        loops: int,
        batch_size: int,
        block_ms: int | None,
        namespace: str,
        redis_url: str,
        room: RoomWaits,
    ) -> None:
        self.broker = broker
        self.handle = handle
        self.stopping = stopping
        self.capacity = capacity
        self.openings = openings
        self.loops = loops
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.namespace = namespace
        self.redis_url = redis_url
        self.room = room

    def asks(self, count: int) -> int:
        """Entries the next read asks for: ``count``, at most this loop's share of the openings (at least one)."""
        return max(1, min(count, math.ceil(self.openings() / self.loops)))

    async def run(self, shards: list[int]) -> None:
        """Read and handle batches of ``shards`` until stopping."""
        failures = refusals = 0
        count = self.batch_size
        carried: list[Filed] = []  # records the last batch held back for the next read (module doc)
        while not self.stopping.is_set():
            try:
                with refusals_named(self.namespace, self.redis_url):
                    if carried and not self.capacity.is_set():  # no read follows at once: file them now
                        pending, carried = carried, []
                        await self.handle([], pending, ())
                    await self.capacity.wait()
                    if self.stopping.is_set():
                        break
                    asked = self.asks(count)
                    # with records held back the read waits for nothing: if it finds none, they are filed at once
                    entries = await self.broker.read(shards, asked, None if carried else self.block_ms)
                    count = next_count(entries, self.batch_size, count)
                    if entries or carried:
                        pending, carried = carried, []  # a batch that fails leaves them pending, as its own entries
                        carried = await self.handle(entries, pending, full_streams(entries, asked))
                if refusals:
                    self.room.took()  # the episode of refusals, if this loop was in one, is over
                failures = refusals = 0
            except Exception as exc:
                if being_cancelled():
                    raise asyncio.CancelledError from exc
                if is_out_of_memory(exc):  # its entries stay pending, reclaimed after claim_idle
                    refusals += 1
                    await self.room.refusal(refusals, "a read batch's bookkeeping", exc)
                    continue
                if is_nogroup(exc):
                    logger.warning("consumer group vanished; re-creating it")
                    await self.broker.ensure_groups()
                    continue
                if not is_transient(exc):
                    raise
                failures += 1
                pause = backoff_delay(failures, cap=READ_BACKOFF_CAP)
                logger.warning("redis unavailable while reading (%s); reading again in %.2fs", exc, pause)
                await asyncio.sleep(pause)
        if carried:  # stopping: filed like the rest of the last batch (a failure leaves them pending)
            try:
                await self.handle([], carried, ())
            except Exception:
                logger.warning(
                    "could not file %d records held back at stop; they stay pending", len(carried), exc_info=True
                )
