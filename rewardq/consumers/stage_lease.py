"""One chunked commit stages results at a time, across the whole fleet.

A trajectory whose results take more than ``commit_bytes`` is committed in chunks
(:meth:`~rewardq.queue.broker.StreamBroker.commit_calls`): each chunk but the last is staged
under keys nobody reads, and holds its memory until the last chunk renames them all into
place. Two such commits staging together can fill ``maxmemory`` with halves of which neither
can finish: each waits for room the other holds, and both end as ``memory`` errors although
either alone would have fitted. Inside one worker :class:`~rewardq.consumers.commits.CommitCoalescer`
sends them one at a time; across workers :class:`StageLease` does, through a lease in Redis
(``lua/stage.lua``; one per Redis, one per shard on a cluster):

- a worker takes it before it stages its first chunk; a worker that finds it held waits, with
  the backoff of :class:`~rewardq.consumers.retries.RoomWaits` (counted in ``stage_waits`` in
  the heartbeat, so ``rewardq status`` shows the fleet queueing for it), for as long as it takes:
  the holder either finishes or gives up within its own ``room_wait``;
- the holder renews it every third of :data:`~rewardq.queue.commit_calls.STAGE_LEASE_SECONDS`, and
  before each chunk says how many keys it has staged (that one included);
- it gives it back after the last chunk (or after deleting what it staged, when it gave up);
- a holder that died stops renewing: the next taker deletes its staged keys (named in the
  lease) and takes over, so a dead worker's half-commit does not hold Redis until its keys expire.

The lease is a hash of four small fields and is allowed past ``maxmemory``: a full Redis is
exactly when it must work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator

from rewardq.backoff import compute_backoff
from rewardq.consumers.retries import RoomWaits
from rewardq.queue.broker import StreamBroker
from rewardq.queue.commit_calls import STAGE_LEASE_SECONDS

logger = logging.getLogger("rewardq.worker")


class Staging:
    """A held stage lease: :meth:`staging` before each chunk is sent."""

    def __init__(self, broker: StreamBroker, shard: int, token: str, prefix: str) -> None:
        self.broker, self.shard, self.token, self.prefix = broker, shard, token, prefix
        self.staged = 0
        self.lost = False

    async def staging(self, staged: int) -> None:
        """Say that keys ``0..staged-1`` are staged once the next chunk is in, before sending it."""
        self.staged = max(self.staged, staged)
        await self.renew()

    async def renew(self) -> None:
        held, holder = await self.broker.stage_lease(
            self.shard, "renew", self.token, prefix=self.prefix, staged=self.staged
        )
        if not held and not self.lost:
            self.lost = True  # its last chunk will find its staged keys gone and fail: scored again
            logger.warning(
                "the stage lease of %s was taken over (by %s) while it staged", self.prefix, holder or "nobody"
            )


class StageLease:
    """Takes and holds the fleet's stage lease for one chunked commit (module doc).

    Args:
        broker: the worker's gateway to Redis.
        room: the one backoff for writes that wait on Redis (its ``base``, ``cap`` and ``rand``).
        stats: the worker's counters (``stage_waits``: chunked commits that waited for the lease).
    """

    def __init__(self, broker: StreamBroker, room: RoomWaits, stats: dict[str, int]) -> None:
        self.broker = broker
        self.room = room
        self.stats = stats

    @contextlib.asynccontextmanager
    async def held(self, shard: int, prefix: str, what: str) -> AsyncIterator[Staging]:
        """Hold the lease of ``shard`` while staging under ``prefix`` (``what`` names the commit)."""
        token = f"{self.broker.worker}:{secrets.token_hex(4)}"
        await self._take(shard, token, prefix, what)
        lease = Staging(self.broker, shard, token, prefix)
        keeper = asyncio.create_task(self._keep(lease), name="stage-lease")
        try:
            yield lease
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            try:
                await self.broker.stage_lease(shard, "release", token)
            except Exception as exc:  # noqa: BLE001 - it expires after STAGE_LEASE_SECONDS anyway
                logger.warning("could not give back the stage lease of %s (%s)", what, exc)

    async def _take(self, shard: int, token: str, prefix: str, what: str) -> None:
        tries = 0
        while True:
            held, detail = await self.broker.stage_lease(shard, "take", token, prefix=prefix)
            if held:
                if detail not in ("", "0"):
                    logger.warning("deleted %s staged keys a stopped worker left before staging %s", detail, what)
                return
            tries += 1
            if tries == 1:
                self.stats["stage_waits"] = self.stats.get("stage_waits", 0) + 1
                logger.info("%s waits for the chunked commit staging now (%s) to finish", what, detail)
            r = self.room
            await asyncio.sleep(compute_backoff(tries, base=r.base, cap=r.cap, jitter=0.5, rand=r.rand))

    @staticmethod
    async def _keep(lease: Staging) -> None:
        """Renew ``lease`` every third of its life until cancelled."""
        while True:
            await asyncio.sleep(STAGE_LEASE_SECONDS / 3)
            try:
                await lease.renew()
            except Exception as exc:  # noqa: BLE001 - the next try, or the next chunk's, may get through
                logger.warning("could not renew the stage lease of %s (%s)", lease.prefix, exc)
