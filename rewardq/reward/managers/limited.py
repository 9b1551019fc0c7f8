"""``rate_limited`` (alias ``limited``): a rate-limited manager for LLM-as-judge and paid-API scoring functions.

Each trajectory's final output is scored by calling the scoring function once, after
taking, in this order (as verl's rate-limited manager does):

1. one request token (``max_rpm``),
2. ``estimated_tokens_per_request`` tokens (``max_tpm``),
3. one of ``max_concurrent`` concurrency slots, held for the call,
4. the call itself, under ``timeout`` seconds.

The limits are token buckets holding one second of the rate, as verl's are (120 rpm is a
smooth 2 requests/s with a burst of 2), and they hold **across every worker process of the
fleet**: the limiter's state lives in
Redis under ``<namespace>:ratelimit:<limiter_name>`` (see
:mod:`rewardq.reward.ratelimit`), so eight workers together send the configured rate, not
eight times it (verl keeps its limiters per process). Managers that share a
``limiter_name`` share one budget; give a second judge its own name. When the worker has no
Redis URL (``context.redis_url is None``, e.g. an embedded single-process run) the manager
falls back to an in-process limiter with the same semantics, whose limits then hold for
this process only.

Failures are never rewards (verl scores them 0.0; their ``reward_extra_info`` is kept in the error
result's): a call that times out gives an error result of kind ``timeout`` with
``{"timeout": True, "acc": 0.0}``; a scoring function that raises (or returns something unusable)
gives one of the kind its exception says (``transient`` for a judge that is down, retried in
place; ``scorer`` for a bug) with ``{"error": "<message>", "acc": 0.0}``. Failures of the limiter
itself (Redis down) are ``transient`` too.

A synchronous scoring function runs where :meth:`~rewardq.reward.base.RewardManager.call_score_fn`
puts it (by default a scorer process, killed and replaced when its call times out; see
docs/isolation.md). Prefer async scoring functions (an HTTP judge) here: they are awaited in
the event loop and cost no process hop.

Options (``--manager-option`` / config)::

    max_concurrent=1  max_rpm=None  max_tpm=None  estimated_tokens_per_request=2000
    timeout=300.0  limiter_name="default"  lease_seconds=30.0
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError, ScoringError, ScoringTimeout
from rewardq.queue.states import failure_kind_of
from rewardq.reward.base import ManagerContext, RewardManager, ScoreFn
from rewardq.reward.http import retry_after_of
from rewardq.reward.ratelimit.limiter import RATE_LIMIT_LEASE_SECONDS, RATE_LIMITED_MAX_CONCURRENT
from rewardq.reward.registry import register
from rewardq.reward.results import normalize_result

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rewardq.reward.tokenizer import Tokenizer


#: Tokens assumed per request (verl's ``estimated_tokens_per_request``) and seconds one call may
#: take (verl's ``timeout``).
RATE_LIMITED_TOKENS_PER_REQUEST = 2000
RATE_LIMITED_TIMEOUT = 300.0

logger = logging.getLogger("rewardq.reward.rate_limited")


def _positive(name: str, value: object, *, allow_none: bool, integer: bool = False) -> None:
    if value is None and allow_none:
        return
    kind = "an integer" if integer else "a number"
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float)) and value > 0
    if not ok:
        extra = " or None (unlimited)" if allow_none else ""
        raise ConfigError(f"manager 'rate_limited': {name} must be {kind} > 0{extra}, got {value!r}")


@register("rate_limited", aliases=("limited",))
class LimitedRewardManager(RewardManager):
    """Scores the final output through a fleet-wide rate limiter; see the module docstring.

    Args:
        tokenizer: the policy tokenizer (decodes the response).
        compute_score: the scoring function (sync or async); None selects
            ``rewardq.reward.scoring.default_compute_score``.
        context: the worker's context; ``redis_url`` and ``namespace`` place the limiter.
        max_concurrent: calls in flight at once across the fleet (None: unlimited).
        max_rpm: requests per minute across the fleet (None: unlimited).
        max_tpm: tokens per minute across the fleet (None: unlimited).
        estimated_tokens_per_request: what one call is charged against ``max_tpm``.
        timeout: seconds one call may take.
        limiter_name: the shared limiter's name (managers with the same name share limits).
        lease_seconds: how long a concurrency slot outlives a worker that died holding it.
    """

    reads = "final"  # run_single reads data[-1:] only

    def __init__(
        self,
        tokenizer: Tokenizer,
        compute_score: ScoreFn | None = None,
        *,
        context: ManagerContext | None = None,
        max_concurrent: int | None = RATE_LIMITED_MAX_CONCURRENT,
        max_rpm: float | None = None,
        max_tpm: float | None = None,
        estimated_tokens_per_request: float = RATE_LIMITED_TOKENS_PER_REQUEST,
        timeout: float = RATE_LIMITED_TIMEOUT,
        limiter_name: str = "default",
        lease_seconds: float = RATE_LIMIT_LEASE_SECONDS,
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        _positive("max_concurrent", max_concurrent, allow_none=True, integer=True)
        _positive("max_rpm", max_rpm, allow_none=True)
        _positive("max_tpm", max_tpm, allow_none=True)
        _positive("estimated_tokens_per_request", estimated_tokens_per_request, allow_none=False)
        _positive("timeout", timeout, allow_none=False)
        _positive("lease_seconds", lease_seconds, allow_none=False)
        if not isinstance(limiter_name, str) or not limiter_name or any(c in limiter_name for c in "{} \n"):
            raise ConfigError(
                f"manager 'rate_limited': limiter_name must be a non-empty name without "
                f"braces or spaces, got {limiter_name!r}"
            )
        self.max_concurrent = max_concurrent
        self.max_rpm = max_rpm
        self.max_tpm = max_tpm
        self.estimated_tokens_per_request = estimated_tokens_per_request
        self.timeout = float(timeout)
        self.limiter_name = limiter_name
        self.lease_seconds = float(lease_seconds)
        self.limiter: Any = None

    # -- lifecycle -------------------------------------------------------------------
    async def setup(self) -> None:
        """Connect to the pipeline's Redis and build the fleet limiter (or the local one)."""
        if self.limiter is not None:
            return
        from rewardq.queue.keys import Keyspace
        from rewardq.reward.ratelimit import open_limiter

        key = Keyspace(self.context.namespace).ratelimit(self.limiter_name)
        self.limiter = open_limiter(
            self.context.redis_url,
            key,
            cluster=self.context.cluster,
            max_rpm=self.max_rpm,
            max_tpm=self.max_tpm,
            max_concurrent=self.max_concurrent,
            lease_seconds=self.lease_seconds,
            holder_prefix=f"{self.context.worker_name}:{os.getpid()}",
        )
        if self.context.redis_url is None:
            logger.info("rate_limited: no Redis configured; limits hold within this process only")
            return
        logger.info(
            "rate_limited: fleet limiter %s (rpm=%s tpm=%s concurrent=%s)",
            key,
            self.max_rpm,
            self.max_tpm,
            self.max_concurrent,
        )

    async def close(self) -> None:
        if self.limiter is not None:
            await self.limiter.close()
        self.limiter = None

    # -- scoring ---------------------------------------------------------------------
    def _score_fn(self) -> ScoreFn:
        if self.compute_score is None:
            from rewardq.reward.scoring import default_compute_score

            self.compute_score = default_compute_score
        return self.compute_score

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        from rewardq.reward.final_output import aread_final_output, merge_rollout_fields

        if self.limiter is None:
            await self.setup()
        final = await aread_final_output(self, data)  # the final row only: data[-1:] (last_row)
        data_source = final.data_source
        extra_info = merge_rollout_fields(final.extra_info, final.row, turns_and_scores=False)
        fn = self._score_fn()

        await self.limiter.acquire_request()
        await self.limiter.acquire_tokens(self.estimated_tokens_per_request)
        async with self.limiter.slot():
            try:
                result = await asyncio.wait_for(
                    self.call_score_fn(
                        fn,
                        data_source=data_source,
                        solution_str=final.solution_str,
                        ground_truth=final.ground_truth,
                        extra_info=extra_info,
                    ),
                    timeout=self.timeout,
                )
                return normalize_result(result)
            except asyncio.TimeoutError:
                logger.warning(
                    "rate_limited: scoring timed out after %.1fs (data_source=%s)", self.timeout, data_source
                )
                raise ScoringTimeout(
                    f"the scoring function timed out after {self.timeout:g}s (the rate_limited manager's timeout)",
                    extra_info={"timeout": True, "acc": 0.0},
                ) from None
            except ScoringError as exc:  # verl's extra info, beside the kind the failure says
                exc.extra_info = {**(exc.extra_info or {}), "acc": 0.0}
                raise
            except Exception as exc:
                raise ScoringError(
                    f"{type(exc).__name__}: {exc}",
                    failure_kind=failure_kind_of(exc),
                    retry_after=retry_after_of(exc),
                    extra_info={"acc": 0.0},
                ) from exc

    def stats(self) -> dict[str, Any]:
        """The limiter's wait counters (``{kind: {"waits", "wait_seconds"}}``) for metrics."""
        return self.limiter.stats() if self.limiter is not None else {}
