"""``gdpo``: ``naive`` plus the experiment name, for multi-component rewards.

GDPO-style training normalises several reward components separately, so its scoring
functions return one dict with every component::

    def compute_score(data_source, solution_str, ground_truth, extra_info, **kw):
        return {"score": 1.25, "format_reward": 0.5, "accuracy_reward": 1.0, "length_reward": -0.25}

The manager keeps the whole dict as ``reward_extra_info`` (every component reaches the
trainer) and ``score`` as the reward. ``extra_info`` is built as in ``naive`` (a copy
with ``extra_fields``, ``num_turns`` and ``rollout_reward_scores``) plus
``extra_info["experiment_name"]``, which some scorers (e.g. ToolRL's) branch on.
verl takes the name from ``trainer.experiment_name``; here it is the manager option
``experiment_name`` (default ``""``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewardq.errors import ConfigError
from rewardq.reward.base import ManagerContext, ScoreFn
from rewardq.reward.final_output import FinalOutput
from rewardq.reward.managers.naive import NaiveRewardManager
from rewardq.reward.registry import register

if TYPE_CHECKING:
    from rewardq.reward.tokenizer import Tokenizer


@register("gdpo")
class GDPORewardManager(NaiveRewardManager):
    """verl's ``gdpo`` manager (see the module docstring).

    Args:
        tokenizer: decodes response ids.
        compute_score: the scoring function; None uses the default scorer by data source.
        context: see :class:`~rewardq.reward.context.ManagerContext`.
        experiment_name: written to ``extra_info["experiment_name"]`` for every sample.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        compute_score: ScoreFn | None = None,
        *,
        context: ManagerContext | None = None,
        experiment_name: str = "",
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        if not isinstance(experiment_name, str):
            raise ConfigError(f"gdpo: experiment_name must be a string, got {type(experiment_name).__name__}")
        self.experiment_name = experiment_name

    def build_extra_info(self, final: FinalOutput) -> dict[str, object]:
        extra_info = super().build_extra_info(final)
        extra_info["experiment_name"] = self.experiment_name
        return extra_info
