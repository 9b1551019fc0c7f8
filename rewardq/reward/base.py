"""The reward-manager contract: one small base class.

A manager turns the batch of one trajectory (a ``TensorDict`` with one row per output,
see :mod:`rewardq.consumers.batch`; read it with :mod:`rewardq.reward.rows`) into a reward::

    class MyManager(RewardManager):
        name = "mine"

        async def run_single(self, data):
            data = data[-1:]                      # built-in managers score the final output
                                                  # (rewardq.reward.last_row: same, cheaper)
            ...
            return {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}

``run_single`` may also return a list of such dicts, one per output (turn-level credit
assignment); rewardq then writes each key its own reward. Returning a single dict copies
it to every key of the trajectory, as verl does.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from rewardq import defaults
from rewardq.errors import ConfigError, ScoringError
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.codeexec.stats import CodeStats
from rewardq.reward.judge.stats import JudgeStats

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from rewardq.reward.isolation import ScoreFnRouter
    from rewardq.reward.tokenizer import Tokenizer

logger = logging.getLogger("rewardq.reward")

ScoreFn = Callable[..., Any]

#: Where a synchronous reward function may run (see :class:`ScoringSettings`).
REWARD_FN_PLACEMENTS = defaults.REWARD_FN_PLACEMENTS


@dataclass
class ScoringSettings:
    """Where a manager's scoring functions run (:mod:`rewardq.reward.isolation`).

    Attributes:
        reward_fn: the worker's ``--reward-fn`` spec; scorer processes load the function by it.
        reward_fn_kwargs: its ``--reward-kwargs``.
        reward_fn_placement: where a synchronous reward function runs: ``process`` (default:
            scorer processes, killed on timeout), ``thread`` or ``inline`` (see docs/isolation.md).
        processes: scorer processes kept ready per function (None: one per core, at least 2).
        spare_after: seconds a busy scorer process still counts toward the pool's size.
        max_spares: spare processes at most, beyond ``processes``.
        max_lost_threads: hung calls of a thread-run function before its calls are refused.
        start_method: ``forkserver`` (Linux default) or ``spawn``.
    """

    reward_fn: str | None = None
    reward_fn_kwargs: dict = field(default_factory=dict)
    reward_fn_placement: str = defaults.REWARD_FN_PLACEMENT
    processes: int | None = defaults.SCORER_PROCESSES
    spare_after: float = defaults.SCORER_SPARE_AFTER
    max_spares: int = defaults.CONCURRENCY
    max_lost_threads: int = defaults.MAX_LOST_THREADS
    start_method: str | None = None

    def __post_init__(self) -> None:
        if self.reward_fn_placement not in REWARD_FN_PLACEMENTS:
            raise ConfigError(
                f"reward_fn_placement must be one of {', '.join(REWARD_FN_PLACEMENTS)}, "
                f"got {self.reward_fn_placement!r}"
            )
        if self.processes is not None and (
            isinstance(self.processes, bool) or not isinstance(self.processes, int) or self.processes < 1
        ):
            raise ConfigError(f"scorer_processes must be an integer >= 1, got {self.processes!r}")

    def process_count(self) -> int:
        """Scorer processes per function: ``processes``, or one per core (at least 2)."""
        return self.processes or max(2, os.cpu_count() or 2)


@dataclass
class ManagerContext:
    """What a manager may need from the worker that hosts it.

    Attributes:
        redis_url: the pipeline's Redis (fleet-wide rate limiters keep their state there).
        namespace: the pipeline's namespace (limiter keys live under it).
        worker_name: the hosting worker's name (for logs and limiter bookkeeping).
        cluster: True when ``redis_url`` is a Redis Cluster.
        scoring: where scoring functions run (see :class:`ScoringSettings`).
        extra: anything else a deployment wants to hand its custom managers.
        code: how the default scorer runs code (``sandbox_fusion_*`` / ``code_local_*``
            manager options, which every manager accepts; see
            :mod:`rewardq.reward.codeexec.settings`).
        code_stats: code-execution counters per data source (``rewardq status``, ``/metrics``).
        result_ttl: seconds results live in Redis (0: for ever); LLM-judge answers are kept as long.
        judge_stats: LLM-judge counters per model (``/metrics``; see :mod:`rewardq.reward.judge`).
    """

    redis_url: str | None = None
    namespace: str = defaults.NAMESPACE
    worker_name: str = "local"
    cluster: bool = False
    scoring: ScoringSettings = field(default_factory=ScoringSettings)
    extra: dict = field(default_factory=dict)
    code: CodeExecSettings = field(default_factory=CodeExecSettings)
    code_stats: CodeStats = field(default_factory=CodeStats)
    result_ttl: float = defaults.RESULT_TTL
    judge_stats: JudgeStats = field(default_factory=JudgeStats)
    _code_runtime: Any = field(default=None, init=False, repr=False)

    def code_runtime(self) -> Any:
        """The worker's :class:`~rewardq.reward.codeexec.runtime.CodeRuntime` (created on first use)."""
        if self._code_runtime is None:
            from rewardq.reward.codeexec.runtime import CodeRuntime

            self._code_runtime = CodeRuntime(
                self.code,
                stats=self.code_stats,
                redis_url=self.redis_url,
                namespace=self.namespace,
                cluster=self.cluster,
                worker_name=self.worker_name,
            )
        return self._code_runtime

    async def aclose(self) -> None:
        """Release what the context created (the code runtime's HTTP session and Redis client)."""
        if self._code_runtime is not None:
            await self._code_runtime.close()
            self._code_runtime = None


class RewardManager(ABC):
    """Base class of every reward manager.

    Subclasses take their options as keyword arguments of ``__init__`` (so a misspelt
    option fails at start-up with a TypeError naming it) and implement ``run_single``.

    Args:
        tokenizer: has ``decode(ids, skip_special_tokens=True) -> str``.
        compute_score: the scoring function
            ``f(data_source, solution_str, ground_truth, extra_info, **kw)``, sync or async;
            None selects the default scorer by ``data_source``.
        context: see :class:`ManagerContext`.
    """

    #: Registry name (``--manager NAME``); custom managers loaded as ``module:Class`` may omit it.
    name: ClassVar[str] = ""
    #: What ``run_single`` reads of the trajectory (:data:`READS`): ``"trajectory"`` (the default:
    #: one row per output) or ``"final"`` (a manager that reads only ``data[-1:]`` gets a one-row
    #: batch of the final output, which saves building the other rows). A subclass that overrides
    #: ``run_single`` without declaring it gets the whole trajectory (:func:`reads_of`).
    reads: ClassVar[str] = "trajectory"

    def __init__(
        self,
        tokenizer: Tokenizer | None,
        compute_score: ScoreFn | None = None,
        *,
        context: ManagerContext | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.context = context or ManagerContext()
        self._score_router: ScoreFnRouter | None = None
        self._decoder: Any = None  # BatchDecoder, False when the tokenizer has no batch path, None: not chosen

    async def setup(self) -> None:
        """Called once in the worker's event loop before the first ``run_single``."""

    @abstractmethod
    async def run_single(self, data: TensorDict) -> dict[str, Any] | list[dict[str, Any]]:
        """Score one trajectory. See the module docstring for the return value."""

    async def close(self) -> None:
        """Called once when the worker stops; release pools, sessions, connections.

        Overrides need not call this: the worker also calls :meth:`close_scoring` itself.
        """
        await self.close_scoring()

    # -- where scoring functions run (rewardq.reward.isolation) ------------------------
    @property
    def score_router(self) -> ScoreFnRouter:
        """Runs scoring functions where they belong (see :meth:`call_score_fn`)."""
        if getattr(self, "_score_router", None) is None:
            from rewardq.reward.isolation import ScoreFnRouter

            self._score_router = ScoreFnRouter(
                self.context.scoring, configured=self.compute_score, code_runtime=self.context.code_runtime
            )
        assert self._score_router is not None
        return self._score_router

    async def prepare_scoring(self) -> None:
        """Called by the worker after :meth:`setup`: decide where ``compute_score`` runs, say so
        in the log, and start its scorer processes now rather than on the first trajectory."""
        if self.compute_score is not None:
            await self.score_router.prepare(self.compute_score)

    async def close_scoring(self) -> None:
        """Stop the scorer processes and threads :meth:`call_score_fn` started, and the decode
        thread. Idempotent."""
        router = getattr(self, "_score_router", None)
        if router is not None:
            await router.close()
        decoder = getattr(self, "_decoder", None)
        if decoder:
            decoder.close()
            self._decoder = None

    # -- helpers shared by the built-in managers ---------------------------------------
    def decode_response(self, row: TensorDict, ids: torch.Tensor | None = None) -> str:
        """Decode the valid response of one row (``data[i]`` or ``data[-1:]``) with
        ``skip_special_tokens``; ``ids``: that row's valid response ids when already at hand."""
        if ids is None:
            from rewardq.reward.rows import valid_response_ids

            ids = valid_response_ids(row)
        return self.require_tokenizer().decode(ids, skip_special_tokens=True)

    async def decode_response_async(self, row: TensorDict, ids: torch.Tensor | None = None) -> str:
        """:meth:`decode_response`, off the event loop: the responses every trajectory being scored
        asks for in one loop turn are decoded together, in Rust threads without the GIL
        (:class:`~rewardq.reward.decoding.BatchDecoder`). A tokenizer without that path
        (:func:`~rewardq.reward.tokenizer.batch_decoder`) decodes inline."""
        if ids is None:
            from rewardq.reward.rows import valid_response_ids

            ids = valid_response_ids(row)
        from rewardq.reward.decoding import BatchDecoder

        decoder = getattr(self, "_decoder", None)
        if decoder is None:
            from rewardq.reward.tokenizer import batch_decoder

            native = batch_decoder(self.require_tokenizer())
            decoder = self._decoder = BatchDecoder(native) if native is not None else False
        if not isinstance(decoder, BatchDecoder):
            return self.decode_response(row, ids)
        return await decoder.decode(ids, skip_special_tokens=True)

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer, or ConfigError saying how to give the worker one."""
        if self.tokenizer is None:
            raise ConfigError(
                f"manager {self.name or type(self).__name__!r} decodes responses but was built without a "
                "tokenizer; start the worker with --tokenizer (a tokenizer.json, a Hugging Face folder or builtin:demo)"
            )
        return self.tokenizer

    async def call_score_fn(self, fn: ScoreFn, **kwargs: Any) -> Any:
        """Call a scoring function where it cannot block, kill or stop the worker.

        * the built-in default scorer: by its data source's placement
          (:func:`rewardq.reward.scoring.placement_of`): regex scorers inline in the event
          loop (tens of microseconds), CPU-heavy ones in scorer processes, async ones awaited;
        * an ``async`` function: awaited in the event loop;
        * a sync function: in scorer processes (killed and replaced when the trajectory
          times out), unless ``reward_fn_placement`` says ``thread`` or ``inline``; one that
          cannot be loaded by name in a process (a lambda, a closure) runs in threads.

        ``sys.exit()`` and ``KeyboardInterrupt`` in the function raise a
        :class:`~rewardq.errors.ScoringError` naming them; a scorer process that dies raises
        one naming its exit code or signal. See :mod:`rewardq.reward.isolation`.
        """
        return await self.score_router.call(fn, kwargs)


#: The values of :attr:`RewardManager.reads`.
READS = ("trajectory", "final")


def reads_of(manager: Any) -> str:
    """What ``manager.run_single`` reads: the ``reads`` of the most derived class that declares it
    or defines ``run_single``; one that defines ``run_single`` without declaring ``reads`` reads
    the whole trajectory. Raises ConfigError for a value not in :data:`READS`."""
    for cls in type(manager).__mro__:
        if "reads" in cls.__dict__:
            declared = cls.__dict__["reads"]
            if declared not in READS:
                raise ConfigError(f"{cls.__name__}.reads must be one of {', '.join(READS)}, got {declared!r}")
            return str(declared)
        if "run_single" in cls.__dict__:
            return "trajectory"
    return "trajectory"


def is_async_callable(fn: Any) -> bool:
    """True for ``async def`` functions and for objects whose ``__call__`` is one."""
    call = type(fn).__call__ if not inspect.isroutine(fn) and callable(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def normalize_result(result: Any) -> dict:
    """verl's normalisation of a scoring function's return value.

    A dict gives ``reward_score = result["score"]`` and ``reward_extra_info = the whole dict``;
    a scalar gives ``reward_score = float(result)`` and ``reward_extra_info = {"acc": result}``.
    Raises ScoringError for a dict without ``score``, a non-numeric value, NaN or infinity.
    """
    if isinstance(result, dict):
        if "score" not in result:
            raise ScoringError(
                f"the scoring function returned a dict without 'score' (keys: {sorted(result)}); "
                "return a number or a dict with a 'score' entry"
            )
        score = to_float(result["score"], "score")
        return {"reward_score": score, "reward_extra_info": dict(result)}
    score = to_float(result, "the return value")
    acc = result.item() if hasattr(result, "item") else result
    return {"reward_score": score, "reward_extra_info": {"acc": acc}}


def to_float(value: Any, what: str = "reward_score") -> float:
    """A finite plain float, or ScoringError explaining what came back instead."""
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            raise ScoringError(f"{what} is an array, not a single number") from None
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, (int, float)):
        raise ScoringError(f"{what} must be a number, got {type(value).__name__} {value!r:.80}")
    value = float(value)
    if not math.isfinite(value):
        raise ScoringError(f"{what} is {value}; a reward must be a finite number")
    return value


def check_manager_output(out: Any, n: int) -> list[dict]:
    """Validate what ``run_single`` returned and expand it to one result per output.

    Returns n dicts ``{"reward_score": float, "reward_extra_info": dict}``.
    """
    if isinstance(out, dict):
        items, per_output = [out], False
    elif isinstance(out, (list, tuple)):
        if len(out) != n:
            raise ScoringError(
                f"the manager returned {len(out)} results for a trajectory of {n} outputs; "
                "return one dict, or one per output"
            )
        items, per_output = list(out), True
    else:
        raise ScoringError(f"run_single must return a dict or a list of dicts, got {type(out).__name__}")
    checked = []
    for item in items:
        if not isinstance(item, dict) or "reward_score" not in item:
            raise ScoringError(
                "each result must be a dict with 'reward_score' (and optionally "
                f"'reward_extra_info'), got {item!r:.120}"
            )
        extra = item.get("reward_extra_info") or {}
        if not isinstance(extra, dict):
            raise ScoringError(f"reward_extra_info must be a dict, got {type(extra).__name__}")
        checked.append({"reward_score": to_float(item["reward_score"]), "reward_extra_info": extra})
    return checked if per_output else checked * n


def reject_unknown_options(manager: str, options: dict, known: list[str]) -> None:
    """Fail fast on a misspelt manager option."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"manager {manager!r} does not take option(s) {unknown}; it takes {sorted(known)}")
