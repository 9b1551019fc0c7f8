"""What runs one manager's scoring functions and decodes its responses.

A :class:`~rewardq.reward.base.RewardManager` holds one :class:`ManagerHost`, made on first use
from the manager's context: its :class:`~rewardq.reward.execution.isolation.ScoreFnRouter`
(inline, threads or scorer processes) and its :class:`~rewardq.reward.execution.decoding.BatchDecoder`
(the responses of many trajectories decoded together, off the event loop). The worker starts it
with :meth:`prepare` and stops it with :meth:`close`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rewardq.reward.execution.decoding import BatchDecoder
from rewardq.reward.execution.isolation import ScoreFnRouter
from rewardq.reward.tokenizer_backends import batch_decoder

if TYPE_CHECKING:
    import torch

    from rewardq.reward.context import ManagerContext
    from rewardq.reward.tokenizer import Tokenizer


class ManagerHost:
    """One manager's router and decoder.

    Args:
        context: the manager's context (where scoring functions run, the code runtime).
        compute_score: the manager's configured scoring function (None: the built-in scorer).
    """

    def __init__(self, context: ManagerContext, compute_score: Callable[..., object] | None) -> None:
        self.router = ScoreFnRouter(context.scoring, configured=compute_score, code_runtime=context.code_runtime)
        #: BatchDecoder; False when the tokenizer has no batch path; None: not chosen yet.
        self.decoder: BatchDecoder | bool | None = None

    async def prepare(self, compute_score: Callable[..., object] | None) -> None:
        """Decide where ``compute_score`` runs, say so in the log, and start its scorer processes."""
        if compute_score is not None:
            await self.router.prepare(compute_score)

    async def call(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> object:
        """Call ``fn(**kwargs)`` where it belongs (:mod:`rewardq.reward.execution.isolation`)."""
        return await self.router.call(fn, kwargs)

    async def decode(self, tokenizer: Tokenizer, ids: torch.Tensor, skip_special_tokens: bool = True) -> str:
        """Decode ``ids`` in this loop turn's batch, or inline when ``tokenizer`` has no batch path."""
        if self.decoder is None:
            native = batch_decoder(tokenizer)
            self.decoder = BatchDecoder(native) if native is not None else False
        if not isinstance(self.decoder, BatchDecoder):
            return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return await self.decoder.decode(ids, skip_special_tokens=skip_special_tokens)

    async def close(self) -> None:
        """Stop the scorer processes, threads and the decode thread. Idempotent."""
        await self.router.close()
        if isinstance(self.decoder, BatchDecoder):
            self.decoder.close()
        self.decoder = None
