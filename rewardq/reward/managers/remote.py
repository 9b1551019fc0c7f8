"""``remote``: score in a pool of separate processes, with timeouts that kill.

For CPU-bound scorers (math-verify, sympy): they hold the GIL in a thread pool, and
math-verify's ``signal.alarm`` timeouts fail in any thread but a process's main thread,
so in a thread pool it silently scores 0 for every sample (a long-standing verl bug). Here
each sample is scored in the main thread of one of ``num_workers`` scorer processes
(:class:`rewardq.reward.execution.process_pool.ScorerPool`).

Failures are never rewards (verl scores the first two 0.0; their ``reward_extra_info`` is kept in
the error result's):

* A sample that takes longer than ``timeout`` seconds: its process is killed and replaced; the
  trajectory gets an error result of kind ``timeout`` whose ``reward_extra_info`` holds verl's
  ``{"timeout": True, "acc": 0.0}``. Other samples in flight are unaffected.
* A scorer process that dies (segfault, ``os._exit``): an error result of kind ``scorer`` naming
  what happened (``reward_extra_info`` with verl's ``"acc": 0.0``); the process is replaced.
* A scoring function that raises, or calls ``sys.exit()``, or raises ``KeyboardInterrupt``:
  :class:`~rewardq.errors.ScoringError` with the child's message (``ValueError: ...``,
  ``the reward function called sys.exit(3)``) and the failure kind its exception says, as with
  the ``naive`` manager (the worker writes an error result); the process stays.

What is scored, and how (as verl's naive manager does): the final output only; the scoring function gets
``extra_info`` = a copy of the sample's ``extra_info`` with the final output's
``extra_fields`` merged in, plus ``num_turns`` and ``rollout_reward_scores``.

Which function runs in the children, in order of precedence:

* ``scorer="math_verify"``: the symbolic math-verify scorer
  (:mod:`rewardq.reward.scoring.math_verify_scorer`); ``scorer`` may also be any spec.
* ``scorer_spec="path/to/file.py:fn"`` or ``"package.module:fn"`` (the worker's
  ``--reward-fn``; the factory passes it), with ``scorer_kwargs``. Each child loads it with
  :func:`rewardq.reward.execution.loader.load_score_fn`.
* ``compute_score``, a function: sent by name (``module:qualname``); it must be importable
  by that name in the children (a module-level function), otherwise construction fails.
* nothing: :func:`rewardq.reward.scoring.default_compute_score`.

Async scoring functions are refused at construction: a process pool adds nothing to
them; use ``naive`` or ``limited``. For the same reason the default scorer's ``async``
data sources (code execution: ``codecontests``, ``apps``, ``codeforces``, ``taco``, whose
programs already run in their own sandboxed processes) are awaited in the worker, not sent to
the pool.

Options::

    num_workers=2  timeout=30.0  start_method="forkserver" (Linux) | "spawn"
    scorer=None  scorer_spec=None  scorer_kwargs=None  kill_grace=1.0
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError, ScoringError, ScoringTimeout
from rewardq.reward.base import ManagerContext, RewardManager, ScoreFn
from rewardq.reward.execution.isolation import BUILTIN_SPEC, spec_of
from rewardq.reward.execution.loader import is_async_callable
from rewardq.reward.execution.process_pool import START_METHODS, ScorerPool
from rewardq.reward.execution.scorer_fleet import KILL_GRACE, REMOTE_NUM_WORKERS
from rewardq.reward.registry import register
from rewardq.reward.results import normalize_result

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rewardq.reward.tokenizer import Tokenizer


#: Seconds one ``remote`` call may take.
REMOTE_TIMEOUT = 30.0

logger = logging.getLogger("rewardq.reward.remote")

#: ``scorer=`` shortcuts.
SCORERS = {
    "math_verify": "rewardq.reward.scoring.math_verify_scorer:compute_score",
    "default": BUILTIN_SPEC,
}
DEFAULT_SPEC = SCORERS["default"]


def _is_async_default(data_source: object) -> bool:
    from rewardq.reward.scoring import placement_of

    try:
        return placement_of(data_source) == "async"
    except ScoringError:  # unknown data source: the pool reports it as the other managers do
        return False


@register("remote")
class RemoteRewardManager(RewardManager):
    """Scores the final output in separate processes; see the module docstring.

    Args:
        tokenizer: the policy tokenizer (decodes the response in the parent).
        compute_score: a sync scoring function, or None (see the precedence above).
        context: the worker's context.
        num_workers: scorer processes (= samples scored at once).
        timeout: seconds one sample may take in its process.
        start_method: ``"forkserver"`` (default on Linux) or ``"spawn"``.
        scorer: ``"math_verify"``, ``"default"`` or a spec string.
        scorer_spec: a spec string (what ``--reward-fn`` names).
        scorer_kwargs: extra keyword arguments for the function (verl's ``reward_kwargs``).
        kill_grace: seconds between SIGTERM and SIGKILL for a process that timed out.
    """

    reads = "final"  # run_single reads data[-1:] only

    def __init__(
        self,
        tokenizer: Tokenizer,
        compute_score: ScoreFn | None = None,
        *,
        context: ManagerContext | None = None,
        num_workers: int = REMOTE_NUM_WORKERS,
        timeout: float = REMOTE_TIMEOUT,
        start_method: str | None = None,
        scorer: str | None = None,
        scorer_spec: str | None = None,
        scorer_kwargs: dict[str, object] | None = None,
        kill_grace: float = KILL_GRACE,
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"manager 'remote': timeout must be a number > 0, got {timeout!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"manager 'remote': num_workers must be an integer >= 1, got {num_workers!r}")
        if start_method is not None and start_method not in START_METHODS:
            raise ConfigError(f"manager 'remote': start_method must be one of {START_METHODS}, got {start_method!r}")
        if scorer is not None and scorer_spec is not None:
            raise ConfigError(
                f"manager 'remote': give either scorer={scorer!r} or a reward function ({scorer_spec!r}), not both"
            )
        self.timeout = float(timeout)
        self.target, self.target_kwargs = self._choose_target(compute_score, scorer or scorer_spec, scorer_kwargs)
        self.pool = ScorerPool(
            self.target,
            self.target_kwargs,
            num_workers=num_workers,
            start_method=start_method,
            kill_grace=kill_grace,
            reply_cap=self.context.scoring.reply_bytes,
        )

    @staticmethod
    def _choose_target(
        compute_score: Any, spec: str | None, kwargs: Mapping[str, object] | None
    ) -> tuple[Any, dict[str, Any]]:
        """What the children run (a spec string or a picklable function) and its bound kwargs."""
        kwargs = dict(kwargs or {})
        if spec is not None:
            spec = SCORERS.get(spec, spec)
            if not kwargs and compute_score is not None:
                kwargs = dict(getattr(compute_score, "keywords", None) or {})  # bound by the loader
            from rewardq.reward.execution.loader import load_score_fn

            fn = load_score_fn(spec, kwargs)  # fail fast, in the parent, with the loader's message
            if is_async_callable(fn):
                raise ConfigError(
                    f"manager 'remote' cannot run the async scoring function {spec!r} in worker "
                    "processes; use the 'naive' or 'limited' manager for async functions"
                )
            return spec, kwargs
        if compute_score is None:
            return DEFAULT_SPEC, kwargs
        if is_async_callable(compute_score):
            raise ConfigError(
                f"manager 'remote' cannot run the async scoring function {compute_score!r} in "
                "worker processes; use the 'naive' or 'limited' manager for async functions"
            )
        fn = compute_score
        if isinstance(fn, functools.partial):
            kwargs = {**fn.keywords, **kwargs}
            fn = fn.func
        by_name = spec_of(fn)
        if by_name is not None:
            return by_name, kwargs
        raise ConfigError(
            f"manager 'remote' sends its scoring function to the worker processes by name, and "
            f"{fn!r} cannot be imported by name (a lambda, closure or nested function?); define "
            "it at module level or give it as a spec, e.g. scorer_spec='path/to/file.py:compute_score'"
        )

    def provenance(self, data_source: object) -> dict[str, Any]:
        """``scorer``: the function the children run, when it is not the default one."""
        if self.target == DEFAULT_SPEC or _is_async_default(data_source):
            return {}
        from rewardq.reward.scoring_fingerprint import code_identity

        return {"scorer": f"remote:{code_identity(self.target, default_name='compute_score')}"}

    async def setup(self) -> None:
        """Start the scorer processes (and wait until each has loaded the function)."""
        await self.pool.start()

    async def prepare_scoring(self) -> None:
        """Nothing to prepare: :meth:`setup` started this manager's own pool."""

    async def close(self) -> None:
        await self.pool.close()

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        from rewardq.reward.final_output import aread_final_output, merge_rollout_fields

        final = await aread_final_output(self, data)  # the final row only: data[-1:] (last_row)
        data_source = final.data_source
        extra_info = merge_rollout_fields(final.extra_info, final.row)
        if self.target == DEFAULT_SPEC and _is_async_default(data_source):
            # code execution waits on its own sandboxed processes or HTTP: awaited here, not in the pool
            from rewardq.reward.scoring import default_compute_score

            return normalize_result(
                await self.call_score_fn(
                    default_compute_score,
                    data_source=data_source,
                    solution_str=final.solution_str,
                    ground_truth=final.ground_truth,
                    extra_info=extra_info,
                )
            )
        result = await self.pool.run(
            {
                "data_source": data_source,
                "solution_str": final.solution_str,
                "ground_truth": final.ground_truth,
                "extra_info": extra_info,
            },
            self.timeout,
        )
        if result.status == "ok":
            return normalize_result(result.value)
        if result.status == "timeout":
            logger.warning("remote: scoring timed out after %.1fs (data_source=%s)", self.timeout, data_source)
            raise ScoringTimeout(
                f"the scoring function timed out after {self.timeout:g}s (the remote manager's timeout) in its "
                f"worker process (pid {result.pid}), which was killed and replaced",
                extra_info={"timeout": True, "acc": 0.0},
            )
        if result.status == "crash":
            raise ScoringError(result.message, extra_info={"acc": 0.0})
        raise ScoringError(
            f"the scoring function failed in its worker process (pid {result.pid}): {result.message}",
            failure_kind=result.failure_kind,
            retry_after=result.retry_after,
        )

    def stats(self) -> dict[str, Any]:
        """Pool counters for metrics: tasks, timeouts, crashes, errors, replaced."""
        return dict(self.pool.counters)
