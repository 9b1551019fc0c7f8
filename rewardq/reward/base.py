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
it to every key of the trajectory, as verl does. Where scoring functions run (inline, threads,
scorer processes) is :mod:`rewardq.reward.execution`'s business, which the worker starts and stops.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from rewardq.errors import ConfigError
from rewardq.reward.context import ManagerContext
from rewardq.reward.trace import note_decoded

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from rewardq.reward.execution.host import ManagerHost
    from rewardq.reward.tokenizer import Tokenizer

ScoreFn = Callable[..., Any]

__all__ = ["ManagerContext", "RewardManager", "ScoreFn"]


class RewardManager(ABC):
    """Base class of every reward manager: implement ``run_single``; options are keyword
    arguments of ``__init__`` (so a misspelt option fails at start-up with a TypeError naming it).

    Args:
        tokenizer: has ``decode(ids, skip_special_tokens=True) -> str``.
        compute_score: ``f(data_source, solution_str, ground_truth, extra_info, **kw)``, sync or
            async; None selects the default scorer by ``data_source``.
        context: see :class:`ManagerContext`.
    """

    #: Registry name (``--manager NAME``); custom managers loaded as ``module:Class`` may omit it.
    name: ClassVar[str] = ""
    #: What ``run_single`` reads: ``"trajectory"`` (one row per output) or ``"final"`` (a one-row
    #: batch of the final output, cheaper to build); see :func:`rewardq.reward.results.reads_of`.
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
        self._host: ManagerHost | None = None

    async def setup(self) -> None:
        """Called once in the worker's event loop before the first ``run_single``."""

    @abstractmethod
    async def run_single(self, data: TensorDict) -> dict[str, Any] | list[dict[str, Any]]:
        """Score one trajectory. See the module docstring for the return value."""

    async def close(self) -> None:
        """Called once when the worker stops; release pools, sessions, connections (overrides need
        not call this: the worker also calls :meth:`close_scoring` itself)."""
        await self.close_scoring()

    async def call_score_fn(self, fn: ScoreFn, **kwargs: object) -> Any:
        """Call a scoring function where it cannot block, kill or stop the worker (the built-in
        scorer by its data source's placement, ``async`` functions awaited, sync ones in scorer
        processes unless ``reward_fn_placement`` says otherwise). What a failure becomes, always a
        :class:`~rewardq.errors.ScoringError`: :mod:`rewardq.reward.execution.isolation`."""
        return await self.host.call(fn, kwargs)

    def decode_response(self, row: TensorDict, ids: torch.Tensor | None = None) -> str:
        """Decode the valid response of one row (``data[i]`` or ``data[-1:]``) with
        ``skip_special_tokens``; ``ids``: that row's valid response ids when already at hand."""
        ids = _response_ids(row, ids)
        text = self.require_tokenizer().decode(ids, skip_special_tokens=True)
        note_decoded(len(ids), text)  # the ledger keeps it (rewardq.reward.trace)
        return text

    async def decode_response_async(self, row: TensorDict, ids: torch.Tensor | None = None) -> str:
        """:meth:`decode_response`, off the event loop, batched with the other trajectories' decodes
        (:class:`~rewardq.reward.execution.decoding.BatchDecoder`)."""
        ids = _response_ids(row, ids)
        text = await self.host.decode(self.require_tokenizer(), ids)
        note_decoded(len(ids), text)
        return text

    def provenance(self, data_source: object) -> dict[str, Any]:
        """What this manager adds to the provenance of a result for ``data_source``
        (:mod:`rewardq.reward.provenance`): e.g. ``scorer``, and for judges ``judge_model``,
        ``judge_template`` and ``judge_sampling``. Nothing by default: the scorer is then the
        reward function or the data source's default scorer."""
        return {}

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer, or ConfigError saying how to give the worker one."""
        if self.tokenizer is None:
            raise ConfigError(
                f"manager {self.name or type(self).__name__!r} decodes responses but was built without a "
                "tokenizer; start the worker with --tokenizer (a tokenizer.json, a Hugging Face folder or builtin:demo)"
            )
        return self.tokenizer

    # -- what the worker calls around the manager's life (rewardq.reward.execution) ----------
    @property
    def host(self) -> ManagerHost:
        """This manager's scoring router and response decoder, made on first use."""
        if getattr(self, "_host", None) is None:
            from rewardq.reward.execution.host import ManagerHost  # scorer processes, threads: on first use

            self._host = ManagerHost(self.context, self.compute_score)
        assert self._host is not None
        return self._host

    async def prepare_scoring(self) -> None:
        """After :meth:`setup`: decide where ``compute_score`` runs and start its scorer processes."""
        await self.host.prepare(self.compute_score, self.tokenizer)

    async def close_scoring(self) -> None:
        """Stop what :meth:`call_score_fn` and :meth:`decode_response_async` started. Idempotent."""
        host = getattr(self, "_host", None)
        if host is not None:
            await host.close()


def _response_ids(row: TensorDict, ids: torch.Tensor | None) -> torch.Tensor:
    if ids is not None:
        return ids
    from rewardq.reward.rows import valid_response_ids  # torch and tensordict: a worker's install

    return valid_response_ids(row)
