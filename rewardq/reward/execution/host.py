"""What runs one manager's scoring functions and decodes its responses.

A :class:`~rewardq.reward.base.RewardManager` holds one :class:`ManagerHost`, made on first use
from the manager's context: its :class:`~rewardq.reward.execution.isolation.ScoreFnRouter`
(inline, threads or scorer processes) and its :class:`~rewardq.reward.execution.decoding.BatchDecoder`
(the responses of many trajectories decoded together, off the event loop). The worker starts it
with :meth:`prepare` and stops it with :meth:`close`.

A byte-level BPE tokenizer's responses (GPT-2's scheme, most current models) are decoded in the
event loop through a table of each id's bytes instead (:mod:`rewardq.reward.byte_level`): the same
text as the library's decode, for about a tenth of the library's CPU (figures in
:mod:`rewardq.reward.byte_level`); the hand-off to the decode thread would cost more than the decode. A
response longer than :data:`INLINE_MAX_IDS` still goes to the decode thread, so that no one
decode holds the event loop for long.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rewardq.reward.byte_level import ByteLevelTable
from rewardq.reward.execution.decoding import BatchDecoder
from rewardq.reward.execution.isolation import ScoreFnRouter
from rewardq.reward.tokenizer_backends import exact_rust_tokenizer, rust_decode_batch

if TYPE_CHECKING:
    import torch

    from rewardq.reward.context import ManagerContext
    from rewardq.reward.tokenizer import Tokenizer


#: The longest response decoded through the table in the event loop (~1.5 ms of CPU).
INLINE_MAX_IDS = 32_768


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
        #: the byte-level table of the tokenizer, when it has one (chosen with ``decoder``)
        self.table: ByteLevelTable | None = None

    async def prepare(self, compute_score: Callable[..., object] | None, tokenizer: Tokenizer | None = None) -> None:
        """Decide where ``compute_score`` runs, say so in the log, and start its scorer processes;
        choose how ``tokenizer``'s responses are decoded (its table is built now, not at the first
        trajectory)."""
        if compute_score is not None:
            await self.router.prepare(compute_score)
        if tokenizer is not None and self.decoder is None:
            self._choose_decoder(tokenizer)

    def _choose_decoder(self, tokenizer: Tokenizer) -> None:
        rust = exact_rust_tokenizer(tokenizer)  # the library's tokenizer, when its decode is ours exactly
        native = None if rust is None else rust_decode_batch(rust)
        self.decoder = BatchDecoder(native) if native is not None else False
        self.table = ByteLevelTable.of(rust) if native is not None else None

    async def call(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> object:
        """Call ``fn(**kwargs)`` where it belongs (:mod:`rewardq.reward.execution.isolation`)."""
        return await self.router.call(fn, kwargs)

    async def decode(self, tokenizer: Tokenizer, ids: torch.Tensor, skip_special_tokens: bool = True) -> str:
        """Decode ``ids`` through the tokenizer's byte-level table, else in this loop turn's batch,
        or inline when ``tokenizer`` has no batch path."""
        if self.decoder is None:
            self._choose_decoder(tokenizer)
        if self.table is not None and len(ids) <= INLINE_MAX_IDS:
            text = self.table.decode(ids, skip_special_tokens)
            if text is not None:
                return text
        if not isinstance(self.decoder, BatchDecoder):
            return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return await self.decoder.decode(ids, skip_special_tokens=skip_special_tokens)

    async def close(self) -> None:
        """Stop the scorer processes, threads and the decode thread. Idempotent."""
        await self.router.close()
        if isinstance(self.decoder, BatchDecoder):
            self.decoder.close()
        self.decoder = None
        self.table = None
