"""The rollout side, asyncio flavour: same methods as :class:`~rewardq.producers.client.RewardClient`.

Many coroutines may ``await client.wait_rewards(...)`` at once: one watcher task reads the
``done`` streams and wakes exactly the waiters whose trajectories finished.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rewardq import defaults
from rewardq.errors import RewardTimeout
from rewardq.producers.core import (
    ClientBase,
    ClientSettings,
    Put,
    Waiter,
    check_keys,
    finished_tids,
    parse_results,
    prepare_output,
    prepare_trajectory,
    settings_from_kwargs,
)
from rewardq.queue.aio import being_cancelled
from rewardq.queue.connection import connect_async
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RewardResult

logger = logging.getLogger("rewardq.client")


class AsyncRewardClient(ClientBase):
    """asyncio client for producers (agent loops) and trainers. See RewardClient for the methods."""

    def __init__(self, redis: Any, settings: ClientSettings | None = None, **overrides: Any) -> None:
        super().__init__(redis, settings, **overrides)
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._watch_task: asyncio.Task | None = None

    @classmethod
    def from_url(
        cls, url: str = defaults.REDIS_URL, namespace: str = defaults.NAMESPACE, **kwargs: Any
    ) -> AsyncRewardClient:
        settings = settings_from_kwargs(namespace, kwargs)
        return cls(connect_async(url, cluster=settings.cluster, **kwargs), settings)

    async def keyspace(self) -> Keyspace:
        if self._ks is None:
            probe = Keyspace(self.settings.namespace)
            await self.r.hsetnx(probe.meta, "shards", self.settings.shards or 1)
            return self._keyspace_from_meta(await self.r.hget(probe.meta, "shards"))
        return self._ks

    async def aclose(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
            self._watch_task = None
        await self.r.aclose()

    close = aclose

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _gate(self, shards: Iterable[int]) -> None:
        ks = await self.keyspace()
        for shard in set(shards) & self._backlog.full:
            deadline = time.monotonic() + self._backlog.timeout
            delay = 0.01
            while True:
                length = int(await self.r.xlen(ks.stream(shard)))
                self._backlog.note(shard, length)
                if shard not in self._backlog.full:
                    break
                if time.monotonic() >= deadline:
                    raise self._backlog.error(shard, length)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def _send(self, puts: list[Put]) -> None:
        await self._gate(p.shard for p in puts)
        ks = await self.keyspace()
        shards = sorted({p.shard for p in puts})
        pipe = self.r.pipeline(transaction=not self.cluster and len(shards) == 1)  # one wake-up (see client.py)
        for p in puts:
            pipe.xadd(ks.stream(p.shard), p.fields)
        for shard in shards:
            pipe.xlen(ks.stream(shard))
        replies = await pipe.execute()
        for shard, length in zip(shards, replies[len(puts) :]):
            self._backlog.note(shard, int(length))

    async def put_output(
        self,
        uid: Any,
        session_id: Any,
        index: int,
        output: Any,
        sample: Mapping[str, Any] | None = None,
        final: bool = False,
    ) -> str:
        put = prepare_output(
            await self.keyspace(),
            uid,
            session_id,
            index,
            output,
            sample,
            final=final,
            max_bytes=self.settings.max_record_bytes,
            max_outputs=self.settings.max_outputs,
        )
        await self._send([put])
        return put.key

    async def put_trajectory(
        self, uid: Any, session_id: Any, outputs: Sequence[Any], sample: Mapping[str, Any] | None = None
    ) -> list[str]:
        puts = prepare_trajectory(
            await self.keyspace(),
            uid,
            session_id,
            outputs,
            sample,
            max_bytes=self.settings.max_record_bytes,
            max_outputs=self.settings.max_outputs,
        )
        await self._send(puts)
        return [p.key for p in puts]

    async def get_rewards(self, keys: Iterable[str]) -> dict[str, RewardResult | None]:
        keys = check_keys(keys)
        if not keys:
            return {}
        ks = await self.keyspace()
        pipe = self.r.pipeline(transaction=False)
        for k in keys:
            pipe.hgetall(ks.reward_key(k))
        return parse_results(keys, await pipe.execute())

    async def get_reward(self, key: str) -> RewardResult | None:
        return (await self.get_rewards([key]))[key]

    async def wait_rewards(self, keys: Iterable[str], timeout: float = 600.0) -> dict[str, RewardResult]:
        """Wait until every key has a result; raises RewardTimeout naming the missing keys."""
        w = Waiter(check_keys(keys), timeout)
        tids = {k.rpartition("_")[0] for k in w.keys}
        event = asyncio.Event()
        for t in tids:
            self._watchers.setdefault(t, set()).add(event)
        try:
            await self._ensure_watcher()
            w.absorb(await self.get_rewards(w.keys))
            while w.missing:
                remaining = w.remaining()
                if remaining <= 0:
                    raise RewardTimeout(w.missing, timeout)
                try:
                    await asyncio.wait_for(event.wait(), min(remaining, 2.0))
                except asyncio.TimeoutError:
                    pass  # periodic full re-check below
                event.clear()
                w.absorb(await self.get_rewards(w.missing))
            return w.ordered()
        finally:
            for t in tids:
                s = self._watchers.get(t)
                if s is not None:
                    s.discard(event)
                    if not s:
                        self._watchers.pop(t, None)

    async def _ensure_watcher(self) -> None:
        if self._watch_task is None or self._watch_task.done():
            ks = await self.keyspace()
            last = {}
            for s in range(ks.shards):
                got = await self.r.xrevrange(ks.done(s), count=1)
                last[s] = got[0][0] if got else b"0-0"
            self._watch_task = asyncio.create_task(self._watch(last), name="rewardq-done-watcher")

    async def _watch(self, last: dict[int, bytes]) -> None:
        """Follow the ``done`` streams from the ids in ``last`` and wake the matching waiters.

        On Redis Cluster one XREAD cannot span shards (their streams sit in different slots),
        so each shard gets its own blocking reader; the waiters then wake as soon as any
        shard finishes one of their trajectories.
        """
        if self.cluster and len(last) > 1:
            await asyncio.gather(*(self._watch_streams({s: i}) for s, i in last.items()))
        else:
            await self._watch_streams(last)

    async def _watch_streams(self, last: dict[int, bytes]) -> None:
        ks = await self.keyspace()
        while True:
            try:
                resp = await self.r.xread({ks.done(s): i for s, i in last.items()}, block=1000) or []
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if being_cancelled():
                    raise asyncio.CancelledError from exc
                logger.warning("done-stream watcher: %s; retrying", exc)
                await asyncio.sleep(0.5)
                continue
            for tid in finished_tids(ks, resp, last):
                for ev in self._watchers.get(tid, ()):
                    ev.set()
