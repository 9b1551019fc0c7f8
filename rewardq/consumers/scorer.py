"""Scoring one assembled trajectory: batch, manager call under a timeout, results.

This is the "doing" half of the worker; it knows nothing about streams or acks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from rewardq.consumers.assembly import trajectory_sample
from rewardq.consumers.batch import build_batch
from rewardq.errors import ScoringError
from rewardq.queue.codec import OutputRecord
from rewardq.queue.results import STATUS_OK, RewardResult
from rewardq.reward.base import RewardManager, check_manager_output, reads_of
from rewardq.reward.escapes import describe_escape


async def run_with_timeout(coro: Any, seconds: float) -> Any:
    """``await coro`` for at most ``seconds`` (raises ``asyncio.TimeoutError``).

    On Python 3.11+ this is ``asyncio.timeout``, which runs the manager in the calling
    task; ``asyncio.wait_for`` (3.10) wraps it in a task of its own, one more event-loop
    turn per trajectory.
    """
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:  # Python 3.10
        return await asyncio.wait_for(coro, seconds)
    async with timeout(seconds):
        return await coro


class TrajectoryScorer:
    """Runs a manager on whole trajectories and turns its answer into per-key results.

    Args:
        manager: the reward manager. ``run_single`` receives the trajectory batch: one row per
            output, or only the final output's row when the manager declares ``reads = "final"``
            (:func:`~rewardq.reward.base.reads_of`; the built-in managers, which read ``data[-1:]``).
        manager_name: written into each result (``manager`` field).
        worker_name: written into each result (``worker`` field).
        timeout: seconds one ``run_single`` may take before it counts as failed.
    """

    def __init__(self, manager: RewardManager, *, manager_name: str, worker_name: str, timeout: float) -> None:
        self.manager = manager
        self.manager_name = manager_name
        self.worker_name = worker_name
        self.timeout = timeout
        self.final_only = reads_of(manager) == "final"

    async def score(self, records: Sequence[OutputRecord], *, started_ts: float = 0.0) -> list[RewardResult]:
        """Score a trajectory; one :class:`RewardResult` per output, in index order.

        Raises ScoringError (or whatever the manager raised) when no reward can be given.
        ``SystemExit`` and ``KeyboardInterrupt`` from the manager become a ScoringError naming
        them: they end this trajectory, never the worker (asyncio would re-raise them out of
        the event loop and stop it).
        """
        batch = build_batch(records[-1:] if self.final_only else records, trajectory_sample(records))
        try:
            out: Any = await run_with_timeout(self.manager.run_single(batch), self.timeout)
        except asyncio.TimeoutError:
            raise ScoringError(f"scoring timed out after {self.timeout:g}s (score_timeout)") from None
        except (SystemExit, KeyboardInterrupt) as exc:
            raise ScoringError(describe_escape(exc, "the reward manager's run_single")) from None
        per_key = check_manager_output(out, len(records))
        now = time.time()
        latency = (now - started_ts) * 1000.0 if started_ts else None
        return [
            RewardResult(
                key=rec.key,
                status=STATUS_OK,
                reward_score=item["reward_score"],
                reward_extra_info=item["reward_extra_info"],
                error=None,
                worker=self.worker_name,
                manager=self.manager_name,
                scored_at=now,
                latency_ms=latency,
            )
            for rec, item in zip(records, per_key)
        ]
