"""The rollout side, asyncio flavour: same methods as :class:`~rewardq.producers.client.RewardClient`.

Many coroutines may ``await client.wait_rewards(...)`` at once: one watcher task reads the
``done`` streams and wakes exactly the waiters whose trajectories finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rewardq.errors import RewardTimeout
from rewardq.producers.core import (
    FULL_RECHECK,
    SWEEP_INTERVAL,
    SWEEP_MAX,
    WAIT_TIMEOUT,
    ClientBase,
    ClientSettings,
    Name,
    Output,
    Put,
    PutCall,
    backlog_lengths,
    check_outputs,
    output_count,
    planned_keys,
    settings_from_kwargs,
    split_replies,
)
from rewardq.producers.reading import (
    ReadPlan,
    Waiter,
    check_keys,
    ended,
    finished,
    keys_by_trajectory,
    parse_results,
    parse_trajectory,
    sweep_share,
)
from rewardq.queue import scripts
from rewardq.queue.blobs import write_blob_async
from rewardq.queue.cancels import by_trajectory, cancel_call
from rewardq.queue.clients import AsyncRedis
from rewardq.queue.connection import REDIS_URL, ResponseError, being_cancelled, connect_async
from rewardq.queue.held_connection import HeldConnection
from rewardq.queue.keys import NAMESPACE, Keyspace
from rewardq.queue.results import RewardResult

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

logger = logging.getLogger("rewardq.client")

#: Puts of one client that hold a connection (encoding, sending, waiting for their reply) at once;
#: the others wait before they encode. A gathered batch of 2,048 trajectories then opens 32
#: connections, not the pool's 256: measured in pinned GSM8K bursts of 2,048 (A/B, interleaved),
#: the producer's CPU went from 2.3-2.6 to 1.7-1.8 s a burst and the first burst's wall from
#: 3.9-4.1 to 3.4 s; Redis works through one put at a time, so 32 in flight keep it busy.
PUTS_IN_FLIGHT = 32


class AsyncRewardClient(ClientBase[AsyncRedis]):
    """asyncio client for producers (agent loops) and trainers. See RewardClient for the methods."""

    def __init__(self, redis: AsyncRedis, settings: ClientSettings | None = None, **overrides: object) -> None:
        super().__init__(redis, settings, **overrides)
        self._watchers: dict[str, set[Doorbell]] = {}
        self._watch_task: asyncio.Task[Any] | None = None
        self._watch_ready: asyncio.Future[Any] | None = None  # set once the watcher knows where the streams end
        #: the ``done`` entries of awaited trajectories that carry their results, until their waiters read them
        self._announced: dict[str, Mapping[bytes, Any]] = {}
        self._swept = 0  # where the next sweep starts among the awaited trajectories
        self._put_slots: asyncio.Semaphore | None = None

    @classmethod
    def from_url(cls, url: str = REDIS_URL, namespace: str = NAMESPACE, **kwargs: object) -> AsyncRewardClient:
        settings = settings_from_kwargs(namespace, kwargs)
        return cls(connect_async(url, cluster=settings.cluster, **kwargs), settings)

    async def keyspace(self) -> Keyspace:
        if self._ks is None:
            probe = Keyspace(self.settings.namespace)
            # read first: a Redis past maxmemory refuses HSETNX even when the field is there
            # (redis-py types asyncio hash commands as blocking ones: rewardq.queue.clients)
            have = await self.r.hget(probe.meta, "shards")  # type: ignore[misc]
            if have is None:
                await self.r.hsetnx(probe.meta, "shards", str(self.settings.shards or 1))  # type: ignore[misc]
                have = await self.r.hget(probe.meta, "shards")  # type: ignore[misc]
            return self._keyspace_from_meta(have)
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

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _gate(self, shards: Iterable[int]) -> None:
        ks = await self.keyspace()
        for shard in set(shards) & self._backlog.full:
            wait = self._backlog.waiting(shard)
            while (delay := wait.after(int(await self.r.xlen(ks.stream(shard))))) is not None:
                await asyncio.sleep(delay)

    async def _send(self, call: PutCall) -> None:
        """Send a call's puts: the blobs of its large records first, piece by piece
        (:mod:`rewardq.queue.blobs`), then its entries (see :meth:`ClientBase._send_pipeline`: all or
        nothing). A call that fails deletes the blobs it wrote."""
        blobs = [p.blob for p in call.puts if p.blob is not None]
        if blobs:  # a producer held back by the backlog writes no blob meanwhile
            await self._gate(p.shard for p in call.puts)
        try:
            for name, data in blobs:
                await write_blob_async(self.r, name, data, self.settings.blob_ttl)
            await self._send_entries(call)
        except BaseException:
            with contextlib.suppress(Exception):  # Redis refusing or gone: the blobs' TTL ends them
                for name, _ in blobs:
                    await self.r.delete(name)
            raise

    async def _prepare_and_send(self, call: PutCall, keys: list[str], prepare: Callable[[Keyspace], list[Put]]) -> None:
        """Prepare a call's records (``prepare``: validate and encode them) and send them, with no
        wait between the two: a connection is checked out first
        (:class:`~rewardq.queue.held_connection.HeldConnection`), so a batch of calls made at once
        reaches Redis one call at a time as each is encoded, not after the last one is. ``keys``:
        what the call puts (:func:`~rewardq.producers.core.planned_keys`), all of one trajectory.

        At most :data:`PUTS_IN_FLIGHT` calls of a client encode and send at once; the rest wait
        their turn before encoding. A call whose shard is held back by the backlog prepares its
        records before it waits, so a bad record is refused at once, not after the wait; a call with
        records that go as blobs gives the connection back and sends them as :meth:`_send` does.
        The backlog is looked at once, before the turn: calls already waiting for their turn when
        a shard fills still go in, so a shard may pass ``max_backlog`` by up to that many calls."""
        ks = await self.keyspace()
        if ks.shard_of_key(keys[0]) in self._backlog.full:
            call.puts = prepare(ks)
            await self._send(call)
            return
        if self._put_slots is None:
            self._put_slots = asyncio.Semaphore(PUTS_IN_FLIGHT)
        async with self._put_slots, HeldConnection(self.r) as held:
            call.puts = prepare(ks)
            if any(p.blob is not None for p in call.puts):
                await held.release()  # the blobs need connections of their own
                await self._send(call)
            else:
                await self._send_entries(call, held)

    async def _send_entries(self, call: PutCall, held: HeldConnection | None = None) -> None:
        """Send a call's entries; ``held``: on that connection, its shard not held back (checked)."""
        puts = call.puts
        if held is None:
            await self._gate(p.shard for p in puts)
        ks = await self.keyspace()
        pipe, shards, atomic = self._send_pipeline(ks, puts, None if held is None else held.pipeline)
        call.written = None
        if atomic:
            try:
                replies = await pipe.execute()
            except ResponseError:  # Redis refused it: MULTI/EXEC discarded every XADD
                call.written = False
                raise
        else:
            replies = await pipe.execute(raise_on_error=False)
            failure, added = split_replies(puts, replies)
            if failure is not None:
                for shard, ids in added.items():
                    await self.r.xdel(ks.stream(shard), *ids)
                call.written = False
                raise failure
        self._backlog.note_all(shards, backlog_lengths(replies[len(puts) :]))

    async def put_output(
        self,
        uid: Name,
        session_id: Name,
        index: int,
        output: Output,
        sample: Mapping[str, object] | None = None,
        final: bool = False,
    ) -> str:
        """See :meth:`RewardClient.put_output <rewardq.producers.client.RewardClient.put_output>`."""
        call = PutCall("put_output", uid, session_id, self, index=index)
        with call.errors():
            keys = planned_keys(uid, session_id, index=index, max_outputs=self.settings.max_outputs)
            await self._prepare_and_send(
                call, keys, lambda ks: [self._prepare_output(ks, uid, session_id, index, output, sample, final)]
            )
        return call.puts[0].key

    async def put_trajectory(
        self, uid: Name, session_id: Name, outputs: Sequence[Output], sample: Mapping[str, object] | None = None
    ) -> list[str]:
        """See :meth:`RewardClient.put_trajectory <rewardq.producers.client.RewardClient.put_trajectory>`."""
        call = PutCall("put_trajectory", uid, session_id, self, count=output_count(outputs))
        with call.errors():
            keys = planned_keys(uid, session_id, count=check_outputs(outputs, self.settings.max_outputs))
            await self._prepare_and_send(
                call, keys, lambda ks: self._prepare_trajectory(ks, uid, session_id, outputs, sample)
            )
        return call.keys

    async def cancel(self, keys: Iterable[str]) -> int:
        """See :meth:`RewardClient.cancel <rewardq.producers.client.RewardClient.cancel>`."""
        plan = by_trajectory(check_keys(keys), self.settings.max_outputs)
        if not plan:
            return 0
        ks = await self.keyspace()
        script = self.r.register_script(scripts.source("cancel"))  # type: ignore[misc]  # redis-py's asyncio RedisCluster.register_script is typed for Redis only; it has one
        written = 0
        for tid, indices in plan.items():
            k, a = cancel_call(
                ks, tid, indices, result_ttl=self.settings.result_ttl, max_outputs=self.settings.max_outputs
            )
            written += int(await script(keys=k, args=a))
        await self.r.incr(ks.cancels)
        return written

    async def get_rewards(self, keys: Iterable[str]) -> dict[str, RewardResult | None]:
        """See :meth:`RewardClient.get_rewards <rewardq.producers.client.RewardClient.get_rewards>`."""
        keys = check_keys(keys)
        groups = keys_by_trajectory(keys)
        if len(groups) > ReadPlan.FIRST:  # many trajectories: the bounded reads of the result hashes
            return await self._get_reward_hashes(keys)
        got: dict[str, RewardResult | None] = {}
        rest: list[str] = []
        hashes = await self._trajectory_pipeline(await self.keyspace(), groups).execute()
        for tkeys, h in zip(groups.values(), hashes):
            found, missing = parse_trajectory(tkeys, h)
            got.update(found)
            rest += missing
        if rest:
            got.update(await self._get_reward_hashes(rest))
        return {k: got.get(k) for k in keys}

    async def _get_reward_hashes(self, keys: list[str]) -> dict[str, RewardResult | None]:
        """The results of ``keys`` from their own hashes (round trips of bounded size)."""
        out: dict[str, RewardResult | None] = {}
        plan = ReadPlan(keys)
        for chunk in plan:
            hashes = await self._reward_pipeline(await self.keyspace(), chunk).execute()
            plan.took(hashes)
            out.update(parse_results(chunk, hashes))
        return out

    async def get_reward(self, key: str) -> RewardResult | None:
        return (await self.get_rewards([key]))[key]

    async def wait_rewards(self, keys: Iterable[str], timeout: float = WAIT_TIMEOUT) -> dict[str, RewardResult]:
        """Wait until every key has a result; raises RewardTimeout naming the missing keys."""
        return await self._wait(Waiter(check_keys(keys), timeout))

    async def put_trajectory_and_wait(
        self,
        uid: Name,
        session_id: Name,
        outputs: Sequence[Output],
        sample: Mapping[str, object] | None = None,
        timeout: float = WAIT_TIMEOUT,
    ) -> tuple[list[str], dict[str, RewardResult]]:
        """``put_trajectory`` then ``wait_rewards``, one read of the results fewer.

        The waiter is registered and the ``done``-stream watcher started before the put, so
        the trajectory's completion cannot come before anyone listens, and the results are read
        once, after it (``wait_rewards`` alone must read them first: the trajectory may have
        finished before it was called). Returns the keys and their results; raises
        RewardTimeout naming the missing keys.

        Cancelling the task that awaits this cancels the trajectory (:meth:`cancel`): nobody
        waits for its rewards any more, so the fleet stops scoring it.
        """
        call = PutCall("put_trajectory", uid, session_id, self, count=output_count(outputs))
        with call.errors():  # what can be refused before anything is encoded, and the keyspace read
            keys = planned_keys(uid, session_id, count=check_outputs(outputs, self.settings.max_outputs))
            await self.keyspace()

        async def put() -> None:  # encoded here, after the watcher started: see _prepare_and_send
            with call.errors():
                await self._prepare_and_send(
                    call, keys, lambda ks: self._prepare_trajectory(ks, uid, session_id, outputs, sample)
                )

        try:
            return keys, await self._wait(Waiter(keys, timeout), before=put)
        except asyncio.CancelledError:
            if call.written is not False:  # sent, or perhaps sent: drop it
                await self._cancel_shielded(keys)
            raise

    async def _cancel_shielded(self, keys: list[str]) -> None:
        """:meth:`cancel` ``keys`` from a task being cancelled: the cancel runs to its end even if
        this task is cancelled again; a failure is logged (the caller re-raises its cancellation)."""
        job = asyncio.ensure_future(self.cancel(keys))
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - the task is being cancelled; a failed cancel only costs scoring
            logger.warning("could not cancel %d keys of a cancelled wait (%s); they will be scored", len(keys), exc)

    async def _wait(self, w: Waiter, before: Callable[[], Awaitable[None]] | None = None) -> dict[str, RewardResult]:
        """Listen for ``w``'s trajectories, run ``before`` (the put) if given, wait for every result."""
        tids = {k.rpartition("_")[0] for k in w.keys}
        timeout = w.timeout
        event = Doorbell()
        for t in tids:
            self._watchers.setdefault(t, set()).add(event)
        try:
            await self._ensure_watcher()
            if before is None:
                w.absorb(await self.get_rewards(w.keys))
            else:
                await before()
            while w.missing:
                remaining = w.remaining()
                if remaining <= 0:
                    raise RewardTimeout(w.missing, timeout)
                await event.wait(min(remaining, FULL_RECHECK))  # rung (a done entry, a sweep), or the full re-check
                w.absorb(await self._announced_or_read(w.missing))
            return w.ordered()
        finally:
            for t in tids:
                s = self._watchers.get(t)
                if s is not None:
                    s.discard(event)
                    if not s:
                        self._watchers.pop(t, None)
                        self._announced.pop(t, None)

    async def _announced_or_read(self, keys: list[str]) -> dict[str, RewardResult | None]:
        """The results of ``keys`` from their trajectories' ``done`` entries where those carry them,
        the rest read (:meth:`get_rewards`)."""
        got: dict[str, RewardResult | None] = {}
        rest: list[str] = []
        for tid, tkeys in keys_by_trajectory(keys).items():
            entry = self._announced.get(tid)
            if entry is None:
                rest += tkeys
                continue
            found, missing = parse_trajectory(tkeys, entry)
            got.update(found)
            rest += missing
        if rest:
            got.update(await self.get_rewards(rest))
        return got

    async def _ensure_watcher(self) -> None:
        """Start the one ``done``-stream watcher unless it runs, and wait until it knows where the
        streams end (every completion after this returns wakes its waiters).

        The task is created before any ``await``: coroutines that wait at once (an agent-loop
        worker's whole batch) share one watcher, where each used to start its own, every one
        holding a pooled connection in its blocking XREAD.
        """
        ready = self._watch_ready
        if self._watch_task is None or self._watch_task.done() or ready is None:
            ready = self._watch_ready = asyncio.get_running_loop().create_future()
            self._watch_task = asyncio.create_task(self._watch_from_now(ready), name="rewardq-done-watcher")
        if ready.done():
            ready.result()  # the watcher's start failed: raise it, as awaiting it would
        else:
            await asyncio.shield(ready)

    async def _watch_from_now(self, ready: asyncio.Future[Any]) -> None:
        try:
            ks = await self.keyspace()
            last = {}
            for s in range(ks.shards):
                got = await self.r.xrevrange(ks.done(s), count=1)
                last[s] = got[0][0] if got else b"0-0"
        except BaseException as exc:
            if not ready.done():
                if isinstance(exc, asyncio.CancelledError):
                    ready.cancel()
                else:
                    ready.set_exception(exc)
            raise
        ready.set_result(None)
        sweeper = asyncio.create_task(self._sweep_forever(), name="rewardq-done-sweeper")
        try:
            await self._watch(last)
        finally:
            sweeper.cancel()
            await asyncio.wait({sweeper}, timeout=SWEEP_INTERVAL)  # bounded: it ends at its next await

    async def _sweep_forever(self) -> None:
        """Every :data:`SWEEP_INTERVAL` seconds, while anyone waits: :meth:`_sweep`."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            if not self._watchers:
                continue
            try:  # bounded: a sweep stuck on a half-open connection must not end the sweeps
                await asyncio.wait_for(self._sweep(), SWEEP_INTERVAL * 5)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if being_cancelled():
                    raise asyncio.CancelledError from exc
                if isinstance(exc, TimeoutError):
                    why = f"no answer within {SWEEP_INTERVAL * 5:.0f} s (Redis slow or the connection stuck)"
                else:
                    why = str(exc) or type(exc).__name__
                logger.warning("done-stream sweep: %s; trying again in %.0f s", why, SWEEP_INTERVAL)

    async def _sweep(self) -> None:
        """Ring the waiters of every awaited trajectory (at most :data:`SWEEP_MAX`, in turn) whose
        hash says it has ended: one pipelined ``HGET <traj> state`` each."""
        tids, self._swept = sweep_share(list(self._watchers), self._swept, SWEEP_MAX)
        states = await self._state_pipeline(await self.keyspace(), tids).execute()
        for tid in ended(tids, states):
            for bell in self._watchers.get(tid, ()):
                bell.set()

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
            for tid, fields in finished(ks, resp, last):
                bells = self._watchers.get(tid)
                if bells:
                    if b"result_rows" in fields:
                        self._announced[tid] = fields
                    for bell in bells:
                        bell.set()


class Doorbell:
    """What wakes one waiter: the ``done``-stream watcher rings it; the waiter sleeps until it rings
    or a timeout passes, on one future and one timer (``asyncio.wait_for`` on an ``Event`` starts a
    task per sleep: a cost paid per trajectory)."""

    def __init__(self) -> None:
        self._rung = False
        self._sleeping: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._rung = True
        if self._sleeping is not None and not self._sleeping.done():
            self._sleeping.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Return once rung (since the last return) or after ``timeout`` seconds."""
        if not self._rung:
            loop = asyncio.get_running_loop()
            sleeping = self._sleeping = loop.create_future()
            timer = loop.call_later(timeout, _wake, sleeping)
            try:
                await sleeping
            finally:
                timer.cancel()
                self._sleeping = None
        self._rung = False


def _wake(sleeping: asyncio.Future[None]) -> None:
    if not sleeping.done():
        sleeping.set_result(None)
