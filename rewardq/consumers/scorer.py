"""Scoring one assembled trajectory: batch, manager call under a timeout, checked results.

This is the "doing" half of the worker; it knows nothing about streams or acks. Whatever the
manager does instead of returning ends as a :class:`~rewardq.errors.ScoringError` naming it, so
its trajectory gets an error result: an exception, a timeout (a
:class:`~rewardq.errors.ScoringTimeout`), ``sys.exit``, ``KeyboardInterrupt``, a
``CancelledError`` the worker did not ask for, or any other ``BaseException``. Only the worker's
own cancellation (at shutdown) passes through, to hand the trajectory back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from rewardq.consumers.assembly import trajectory_sample
from rewardq.consumers.batch import build_batch
from rewardq.errors import ScoringError, ScoringTimeout
from rewardq.queue.codec import OutputRecord
from rewardq.queue.results import MAX_RESULT_BYTES, STATUS_OK, EncodedResults, RewardResult, encode_results
from rewardq.reward.base import RewardManager
from rewardq.reward.execution.budget import run_within_budget
from rewardq.reward.execution.escapes import describe_escape
from rewardq.reward.results import check_manager_output, reads_of
from rewardq.reward.trace import ScoringTrace, tracing

_RUN_SINGLE = "the reward manager's run_single"


def cancelled_by_caller(stopping: Callable[[], bool]) -> bool:
    """Whether a ``CancelledError`` in the current task is a cancellation someone asked for.

    On Python 3.11+ the task says so (``Task.cancelling()``): a ``CancelledError`` that user code
    raised itself, or let out of a task of its own that was cancelled, leaves it at 0. Python 3.10
    cannot tell; there the worker's own shutdown (``stopping``) is the only cancellation it makes.
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if cancelling is not None:
        return bool(cancelling())
    return stopping()


class TrajectoryScorer:
    """Runs a manager on whole trajectories and turns its answer into checked per-key results.

    Args:
        manager: the reward manager. ``run_single`` receives the trajectory batch: one row per
            output, or only the final output's row when the manager declares ``reads = "final"``
            (:func:`~rewardq.reward.results.reads_of`; the built-in managers, which read ``data[-1:]``).
        manager_name: written into each result (``manager`` field).
        worker_name: written into each result (``worker`` field).
        timeout: seconds one ``run_single`` may take before it counts as failed, not counting the
            time its calls wait for a scorer process or thread
            (:mod:`rewardq.reward.execution.budget`).
        max_result_bytes: the most one key's stored result may take (see :func:`encode_results`).
        stopping: whether the worker is shutting down (Python 3.10's way to tell its own cancellation).
    """

    def __init__(
        self,
        manager: RewardManager,
        *,
        manager_name: str,
        worker_name: str,
        timeout: float,
        max_result_bytes: int = MAX_RESULT_BYTES,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.manager = manager
        self.manager_name = manager_name
        self.worker_name = worker_name
        self.timeout = timeout
        self.max_result_bytes = max_result_bytes
        self.stopping = stopping
        self.final_only = reads_of(manager) == "final"

    async def score(
        self,
        records: Sequence[OutputRecord],
        *,
        started_ts: float = 0.0,
        attempt: int = 0,
        provenance: str = "",
        trace: ScoringTrace | None = None,
    ) -> EncodedResults:
        """Score a trajectory; its results, one per output in index order, checked and encoded for
        the commit (:func:`~rewardq.queue.results.encode_results`). Each result carries
        ``provenance`` (a digest, :mod:`rewardq.reward.provenance`) and ``attempt``; ``trace``
        collects what the manager noticed (:mod:`rewardq.reward.trace`): the judge request each
        key's reward came from goes into its ``judge_request``.

        Raises ScoringError (or whatever Exception the manager raised) when no reward can be given,
        ResultError (a ScoringError) when the results cannot be stored. Any ``BaseException`` from the
        manager becomes a ScoringError naming it (asyncio would re-raise ``SystemExit`` and
        ``KeyboardInterrupt`` out of the event loop and stop the worker; a stray ``CancelledError``
        would hand the trajectory back for ever), except the worker's own cancellation.
        """
        batch = build_batch(records[-1:] if self.final_only else records, trajectory_sample(records))
        try:
            with tracing(trace):
                out: object = await run_within_budget(self.manager.run_single(batch), self.timeout)
        except asyncio.TimeoutError:
            raise ScoringTimeout(f"scoring timed out after {self.timeout:g}s (score_timeout)") from None
        except asyncio.CancelledError:
            if cancelled_by_caller(self.stopping):
                raise
            raise ScoringError(
                f"{_RUN_SINGLE} raised CancelledError although the worker did not cancel it (did it "
                "await a task or future that was cancelled?); catch it inside the manager, or let it "
                "fail with an ordinary exception"
            ) from None
        except Exception:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt, GeneratorExit from a manager: named
            reason = describe_escape(exc, _RUN_SINGLE)
            if reason is None:
                reason = f"{_RUN_SINGLE} raised {type(exc).__name__}, a BaseException that is not an Exception: {exc}"
            raise ScoringError(reason) from None
        per_key = check_manager_output(out, len(records))
        now = time.time()
        latency = (now - started_ts) * 1000.0 if started_ts else None
        judged = trace.judged if trace is not None else {}
        last_judged = judged[max(judged)][0] if judged else ""
        results = [
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
                provenance=provenance,
                attempt=attempt,
                judge_request=judged[rec.index][0] if rec.index in judged else last_judged,
            )
            for rec, item in zip(records, per_key)
        ]
        return encode_results(results, self.max_result_bytes)
