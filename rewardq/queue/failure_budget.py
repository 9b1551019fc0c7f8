"""One verl run's failure budget in Redis: the outcomes of its last trajectories, shared by every process.

verl scores a run's trajectories in many processes (8 reward-loop actors, or 8 agent-loop workers,
by default, each picked at random per trajectory), so a budget counted per process would mean eight
times the window it says. :class:`OutcomeWindow` keeps the run's last ``window`` outcomes in one
hash, ``<ns>:verl-budget:<run>`` (:mod:`rewardq.queue.keys`), changed only by ``lua/budget.lua``:
each call writes one outcome into a ring of ``window`` fields, keeps a count per label, and returns
the counts. One key, so it runs on one slot of a Redis Cluster; O(labels) per call.

The same hash keeps the run's totals per label (``t:<label>``, every trajectory, not only the
window's) and how many scored samples were left out of training with their group
(``t:dropped``, :meth:`OutcomeWindow.count_dropped`): the V1 trainer's step metrics read them with
:func:`run_totals`. What an outcome means and when the run stops is
:mod:`rewardq.integrations.verl.budget`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rewardq.queue import scripts
from rewardq.queue.retry import script_call

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis, SyncRedis

#: Seconds a run's hash outlives its last outcome: a run that stopped leaves nothing behind for long.
BUDGET_TTL = 24 * 3600
#: What recording an outcome answers: how many outcomes the window holds, and how many are each label.
Counted = tuple[int, dict[str, int]]
#: One outcome waiting for the end of its loop turn: the outcome, the window, its reply.
Pending = tuple[str, int, "asyncio.Future[Counted]"]
#: The most outcomes one script call records (``lua/budget.lua`` refuses more).
MOST_PER_CALL = 256
#: The total of scored samples left out of training with their group (not an outcome: they were scored).
DROPPED = "dropped"


def total_field(label: str) -> str:
    """The hash field of the run's total of ``label`` (an outcome, or :data:`DROPPED`)."""
    return f"t:{label}"


def run_totals(redis: SyncRedis, key: str, labels: Sequence[str]) -> dict[str, int]:
    """The run's totals of ``labels`` (every trajectory of the run), read with a blocking client:
    what a trainer's step metrics take the difference of."""
    values = redis.hmget(key, [total_field(label) for label in labels])
    return {label: int(v or 0) for label, v in zip(labels, values)}


class OutcomeWindow:
    """The script calls on one run's budget hash.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` client.
        key: the run's hash, ``Keyspace(ns).verl_budget(run)``.
        labels: every outcome a caller records (``ok`` and the failure kinds); counted in this order.
    """

    def __init__(self, redis: AsyncRedis, key: str, labels: Sequence[str]) -> None:
        self.redis = redis
        self.key = key
        self.labels = tuple(labels)
        self._script = redis.register_script(scripts.standalone("budget"))  # type: ignore[misc]  # redis-py's asyncio RedisCluster.register_script is typed for Redis only; it has one
        #: outcomes recorded in this loop turn, sent together at its end: (outcome, window, its reply)
        self._pending: list[Pending] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def record(self, outcome: str, window: int) -> Counted:
        """Add ``outcome`` to the run's window of ``window`` outcomes: how many the window holds
        (at most ``window``) and how many of them are each label, just after it.

        The outcomes recorded in one turn of the event loop (a batch of trajectories scored
        together) go in one script call, in the order recorded; each gets what a call of its own
        would have returned at that point of the sequence."""
        if outcome not in self.labels:
            raise ValueError(f"unknown outcome {outcome!r}; known: {self.labels}")
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Counted] = loop.create_future()
        self._pending.append((outcome, window, reply))
        if len(self._pending) == 1:
            loop.call_soon(self._send_pending)
        return await reply

    def _send_pending(self) -> None:
        pending, self._pending = self._pending, []
        while pending:
            window = pending[0][1]
            same = 0
            while same < min(len(pending), MOST_PER_CALL) and pending[same][1] == window:
                same += 1
            task = asyncio.ensure_future(self._send(pending[:same], window))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
            pending = pending[same:]

    async def _send(self, calls: list[Pending], window: int) -> None:
        n = len(self.labels)
        args = [str(window), str(BUDGET_TTL), str(n), *self.labels, *(outcome for outcome, _, _ in calls)]
        try:
            with script_call():  # never re-sent by the retry policy: an outcome counted twice
                reply = [int(x) for x in await self._script(keys=[self.key], args=args)]
        except BaseException as exc:
            for _, _, future in calls:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for i, (_, _, future) in enumerate(calls):
            row = reply[i * (n + 1) : (i + 1) * (n + 1)]
            if not future.done():
                future.set_result((row[0], dict(zip(self.labels, row[1:]))))

    async def totals(self) -> dict[str, int]:
        """How many outcomes of the run were each label (every trajectory, not only the window's)."""
        values = await self.redis.hmget(self.key, [total_field(label) for label in self.labels])  # type: ignore[misc]  # hmget is typed blocking for the union of clients
        return {label: int(v or 0) for label, v in zip(self.labels, values)}

    async def count_dropped(self, n: int) -> None:
        """Count ``n`` scored samples left out of training because their group kept fewer than two."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hincrby(self.key, total_field(DROPPED), n)
        pipe.expire(self.key, BUDGET_TTL)  # the key may be new: never leave it without its TTL
        await pipe.execute()
