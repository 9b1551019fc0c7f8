"""One fleet, one scoring configuration per namespace.

Workers that score one namespace with different managers, options, reward functions or tokenizers
would hand the trainer a mix of rewards, silently. So the first worker records the fingerprint of
its scoring configuration (:mod:`rewardq.reward.scoring_fingerprint`) in ``<ns>:meta``
(:mod:`rewardq.queue.scoring_record`), and :class:`ScoringGate` holds every later worker to it:

* the same fingerprint: the worker starts;
* another one, without ``--takeover``: :class:`~rewardq.errors.ScoringConflict` (exit code 2), naming
  both configurations, which live workers run the recorded one, and the two ways on: another
  ``--namespace`` to run both side by side, or ``--takeover`` for a rolling upgrade;
* another one, with ``--takeover``: the worker waits, saying so every ``TAKEOVER_LOG_EVERY``
  seconds with the names of the workers it waits for, until no live worker's heartbeat carries
  another fingerprint than its own; then it records its own (a compare-and-set: of several takeover
  workers with one configuration, the first records it and the others find it recorded) and starts.
  A stop requested while it waits ends the wait and the worker, cleanly.

A running worker looks at the recorded fingerprint with every heartbeat (:meth:`ScoringGate.superseded`):
one whose configuration was replaced (it missed heartbeats long enough to count as gone, say, and a
takeover worker took over) stops taking new work, finishes what it holds and exits 2 with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rewardq.config import WorkerConfig
from rewardq.errors import ScoringConflict
from rewardq.queue.keys import Keyspace
from rewardq.queue.scoring_record import (
    RecordedScoring,
    live_scorings,
    record_scoring,
    recorded_scoring,
    replace_scoring,
)
from rewardq.reward.scoring_fingerprint import ScoringFingerprint, differences

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

#: Seconds between a waiting ``--takeover`` worker's looks at the live workers (and its log lines).
TAKEOVER_POLL = 1.0
TAKEOVER_LOG_EVERY = 10.0


logger = logging.getLogger("rewardq.worker")


class ScoringGate:
    """Holds a worker to the scoring configuration its namespace records.

    Args:
        client: the worker's ``redis.asyncio`` client.
        ks: the namespace's keyspace.
        mine: this worker's fingerprint.
        takeover: replace another recorded configuration once no live worker runs it.
        stopping: true once the worker was asked to stop (ends a takeover's wait).
    """

    def __init__(
        self,
        client: AsyncRedis,
        ks: Keyspace,
        mine: ScoringFingerprint,
        *,
        takeover: bool = WorkerConfig.takeover,
        stopping: Callable[[], bool] = lambda: False,
        poll: float = TAKEOVER_POLL,
        log_every: float = TAKEOVER_LOG_EVERY,
    ) -> None:
        self.r = client
        self.ks = ks
        self.mine = RecordedScoring(mine.digest, mine.text, mine.shown)
        self.takeover = takeover
        self.stopping = stopping
        self.poll = poll
        self.log_every = log_every

    async def join(self) -> bool:
        """Agree with the namespace's recorded configuration (see the module doc); False when the
        worker was asked to stop while it waited to take over."""
        recorded = await record_scoring(self.r, self.ks, self.mine)
        if recorded.digest == self.mine.digest:
            logger.info("scoring configuration %s: %s", self.mine.digest, self.mine.config)
            return True
        if not self.takeover:
            live = await self._others(recorded)
            raise ScoringConflict(conflict_message(self.ks.namespace, recorded, self.mine, live))
        return await self._take_over(recorded)

    async def superseded(self) -> str | None:
        """Why this worker must stop, if the namespace now records another configuration; else None."""
        recorded = await recorded_scoring(self.r, self.ks)
        if recorded is None or recorded.digest == self.mine.digest:
            return None
        return (
            f"namespace {self.ks.namespace!r} now records scoring configuration {recorded.digest} "
            f"({recorded.config}), not this worker's {self.mine.digest} ({self.mine.config}): a --takeover "
            "worker replaced it; this worker takes no new work"
        )

    async def _others(self, recorded: RecordedScoring) -> list[str]:
        """Live workers that run another configuration than this one (``recorded``'s or any other)."""
        return sorted(n for n, d in (await live_scorings(self.r, self.ks)).items() if d and d != self.mine.digest)

    async def _take_over(self, recorded: RecordedScoring) -> bool:
        started = time.monotonic()
        last_log = -self.log_every
        while not self.stopping():
            others = await self._others(recorded)
            if not others:
                if await replace_scoring(self.r, self.ks, recorded, self.mine):
                    logger.warning(
                        "takeover: namespace %r now records scoring configuration %s (%s); it recorded %s (%s)",
                        self.ks.namespace,
                        self.mine.digest,
                        self.mine.config,
                        recorded.digest,
                        recorded.config,
                    )
                    return True
                # another takeover worker recorded a third configuration first: wait for its workers too
                recorded = await recorded_scoring(self.r, self.ks) or recorded
                continue
            if time.monotonic() - last_log >= self.log_every:
                last_log = time.monotonic()
                logger.warning(
                    "takeover: waiting %.0fs so far for %d live worker(s) of namespace %r running another scoring "
                    "configuration to stop (%s); the namespace records %s (%s); this worker will record %s (%s)",
                    last_log - started,
                    len(others),
                    self.ks.namespace,
                    ", ".join(others[:10]),
                    recorded.digest,
                    recorded.config,
                    self.mine.digest,
                    self.mine.config,
                )
            await asyncio.sleep(self.poll)
        logger.info("takeover: stop requested while waiting for the old workers; not started")
        return False


def conflict_message(namespace: str, recorded: RecordedScoring, mine: RecordedScoring, live: list[str]) -> str:
    """The refusal of a worker whose configuration is not the recorded one: both, who runs it, what to do."""
    who = (
        f"live workers running it: {', '.join(live[:5])}{' ...' if len(live) > 5 else ''}"
        if live
        else "no live worker runs it now"
    )
    differ = differences(recorded.shown, mine.shown) if recorded.shown and mine.shown else ""
    return (
        f"namespace {namespace!r} is scored with another configuration: it records [{recorded.config}] "
        f"(fingerprint {recorded.digest}; {who}), this worker has [{mine.config}] (fingerprint {mine.digest})"
        f"{f'; they differ in {differ}' if differ else ''}. "
        "One namespace, one scoring configuration, or the trainer gets a mix of rewards. To run both side by "
        "side give this worker (and its producers) another --namespace; to replace the recorded one (a rolling "
        "upgrade) start the new workers with --takeover: they wait until no live worker runs the old one"
    )
