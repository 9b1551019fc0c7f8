"""A worker's liveness in Redis: its heartbeat and registration, and the leases it holds.

:class:`~rewardq.queue.broker.StreamBroker` holds one :class:`Liveness` (``broker.liveness``), whose
``heartbeat``, ``unregister``, ``renew`` and ``release`` the worker calls:
a worker that beats is alive (``<ns>:worker:<name>``, ``<ns>:workers``), and the trajectories it
scores stay leased to it while it renews them; at a stop it hands them back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from rewardq.queue.keys import Keyspace
from rewardq.queue.results import as_text
from rewardq.queue.script_runner import ScriptRunner

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

_s = as_text
logger = logging.getLogger("rewardq.worker")

#: Seconds between two log lines saying that another live process beats under this name.
SHARED_NAME_LOG_EVERY = 60.0


@dataclass
class Liveness:
    """Heartbeats, registration and trajectory leases of the consumer ``worker`` in its process
    ``life`` (the leases it renews and hands back are this life's only: ``lua/renew.lua``)."""

    r: AsyncRedis
    ks: Keyspace
    scripts: ScriptRunner
    worker: str
    lease_seconds: float
    life: str
    #: When (time.time()) a beat last found another process life's heartbeat under this name since
    #: this one's last beat (0: never): two live processes share the name, and each takes the
    #: other's leases as a new attempt.
    shared_name_at: float = 0.0
    _beaten: bool = field(default=False, repr=False)
    _foreign: bool = field(default=False, repr=False)
    _logged_at: float = field(default=float("-inf"), repr=False)

    async def renew(self, held: dict[int, list[str]]) -> int:
        """Extend leases on trajectories still being scored (``{shard: [tid, ...]}``)."""
        n = 0
        for shard, tids in held.items():
            if tids:
                keys = [self.ks.stream(shard), *(self.ks.traj(shard, t) for t in tids)]
                args = [self.ks.group, self.worker, self.lease_seconds, self.life]
                n += int(await self.scripts.run("renew", keys, args))
        return n

    async def release(self, held: dict[int, list[str]], idle_ms: int) -> int:
        """Hand trajectories back so another worker reclaims them immediately."""
        n = 0
        for shard, tids in held.items():
            if tids:
                keys = [self.ks.stream(shard), *(self.ks.traj(shard, t) for t in tids)]
                n += int(await self.scripts.run("release", keys, [self.ks.group, self.worker, idle_ms, self.life]))
        return n

    # -- presence ---------------------------------------------------------------------------
    async def heartbeat(self, stats: dict[str, object], ttl: float) -> None:
        """Publish this worker's liveness and counters (``<ns>:worker:<name>``, ``<ns>:workers``),
        also past ``maxmemory`` (``lua/beat.lua``: a refused heartbeat would make it look dead)."""
        key = self.ks.worker(self.worker)
        now = time.time()
        mapping = {
            k: (v if isinstance(v, (str, bytes)) else repr(v) if isinstance(v, float) else str(v))
            for k, v in stats.items()
        }
        mapping["last_beat"] = f"{now:.3f}"
        mapping["life"] = self.life  # whose leases are this process's (`lease_life`)
        fields = [v for item in mapping.items() for v in item]
        before = await self.scripts.run("beat", [key], ["hash", max(1, int(ttl)), *fields])  # allowed past maxmemory
        self._check_name(_s(before) if before else None)
        await self.scripts.run("beat", [self.ks.workers], ["member", self.worker, f"{now:.3f}"])

    def _check_name(self, before: str | None) -> None:
        """After this life's first beat its hash names this life, unless another live process
        beat under the same name meanwhile (a dead predecessor's heartbeat is only ever seen by
        the first beat). Two such beats in a row are a live twin (one alone can be a hash Redis
        brought back from before this life's first beat, after a failover or a restart): note
        when, and say so at most every :data:`SHARED_NAME_LOG_EVERY` s."""
        first, self._beaten = not self._beaten, True
        foreign, seen_before = not first and before not in (None, self.life), self._foreign
        self._foreign = foreign
        if not (foreign and seen_before):
            return
        self.shared_name_at = time.time()
        now = time.monotonic()
        if now - self._logged_at >= SHARED_NAME_LOG_EVERY:
            self._logged_at = now
            logger.error(
                "another live process beats under the worker name %r (its life %s, this one's %s): two "
                "processes share --name %s, and each takes the other's leases as a new attempt; give "
                "each process its own --name",
                self.worker,
                before,
                self.life,
                self.worker,
            )

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
