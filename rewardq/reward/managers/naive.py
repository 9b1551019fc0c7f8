"""``naive``: score the final output with the data source's scorer (verl's default manager).

For one trajectory the manager:

1. keeps the final output only (``data = data[-1:]``, built by :func:`~rewardq.reward.rows.last_row`);
2. decodes its valid response with ``skip_special_tokens=True``;
3. reads ``data_source``, ``reward_model["ground_truth"]`` and ``extra_info``;
4. builds a **copy** of ``extra_info`` with the final output's ``extra_fields`` merged in
   (``tool_extra_fields`` in the batch), plus ``num_turns`` and ``rollout_reward_scores``
   (the rollout's own precomputed score, ``{}`` when there is none);
5. calls ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``
   (sync or async; the default scorer picks by ``data_source``);
6. normalises: a dict result gives ``reward_score = result["score"]`` and keeps the whole
   dict as ``reward_extra_info``; a number gives ``reward_extra_info = {"acc": number}``.

verl does step 4 on the dataset's own dict, so every later epoch sees the previous
epoch's ``num_turns``; rewardq never mutates the sample.

Steps 1-3 and 5-6 are :mod:`rewardq.reward.final_output`, shared with the other built-in
managers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewardq.reward.base import ManagerContext, RewardManager, ScoreFn
from rewardq.reward.final_output import FinalOutput, aread_final_output, merge_rollout_fields, score_final_output
from rewardq.reward.registry import register

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rewardq.reward.tokenizer import Tokenizer


@register("naive")
class NaiveRewardManager(RewardManager):
    """verl's ``naive`` manager: the final output, scored by ``compute_score`` (see the module doc).

    Args:
        tokenizer: decodes response ids (``decode(ids, skip_special_tokens=True)``).
        compute_score: ``f(data_source, solution_str, ground_truth, extra_info)``, sync or
            async; None uses :func:`rewardq.reward.scoring.default_compute_score`.
        context: see :class:`~rewardq.reward.context.ManagerContext`.
    """

    reads = "final"  # run_single reads data[-1:] only

    def __init__(
        self, tokenizer: Tokenizer, compute_score: ScoreFn | None = None, *, context: ManagerContext | None = None
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)

    def build_extra_info(self, final: FinalOutput) -> dict[str, object]:
        """The ``extra_info`` handed to the scoring function (a copy; subclasses extend it)."""
        return merge_rollout_fields(final.extra_info, final.row)

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        final = await aread_final_output(self, data)  # the final row only: data[-1:] (last_row)
        return await score_final_output(self, final, self.build_extra_info(final))
