"""The final output of a trajectory, as the built-in managers read and score it.

verl's built-in managers score only the final output (``data[-1:]``). This module is their
shared reading of it (:func:`read_final_output`), the merge of the rollout's own fields
into ``extra_info`` (:func:`merge_rollout_fields`) and the call of the scoring function
with verl's normalisation of its result (:func:`score_final_output`). Custom managers may
use them too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensordict import TensorDict

from rewardq.errors import ScoringError
from rewardq.reward.base import RewardManager
from rewardq.reward.results import normalize_result
from rewardq.reward.rows import copy_value, last_row, non_tensor, valid_response_ids
from rewardq.reward.scoring import default_compute_score


@dataclass
class FinalOutput:
    """What a built-in manager reads from the final row of a trajectory.

    Attributes:
        row: the one-row batch ``data[-1:]``.
        solution_str: the decoded valid response.
        data_source: the sample's ``data_source`` (None when the column is absent).
        ground_truth: ``reward_model["ground_truth"]``.
        extra_info: a deep copy of the sample's ``extra_info`` (``{}`` when absent);
            safe to modify.
        valid_response_length: number of valid response tokens (tool tokens included).
    """

    row: Any
    solution_str: str
    data_source: object
    ground_truth: object
    extra_info: dict[str, Any]
    valid_response_length: int


def read_final_output(manager: RewardManager, data: TensorDict) -> FinalOutput:
    """Read the final output of ``data`` (see :class:`FinalOutput`).

    Raises:
        ScoringError: the sample has no ``reward_model`` dict with ``ground_truth``, or
            ``extra_info`` is not a dict.
    """
    final, ids = _read_final_row(data)
    final.solution_str = manager.decode_response(final.row, ids)
    return final


async def aread_final_output(manager: RewardManager, data: TensorDict) -> FinalOutput:
    """:func:`read_final_output` with the decode off the event loop, batched with the other
    trajectories' (:meth:`~rewardq.reward.base.RewardManager.decode_response_async`): what the
    built-in managers use."""
    final, ids = _read_final_row(data)
    final.solution_str = await manager.decode_response_async(final.row, ids)
    return final


def _read_final_row(data: TensorDict) -> tuple[FinalOutput, Any]:
    """Everything of :class:`FinalOutput` but the decoded text, and the valid response ids."""
    row = last_row(data)
    reward_model = non_tensor(row, "reward_model")
    if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
        raise ScoringError(
            "the sample has no reward_model['ground_truth'] (got reward_model="
            f"{reward_model!r:.80}); built-in managers pass it to the scoring function as "
            "ground_truth, so push samples with reward_model={'ground_truth': ...}"
        )
    extra_info = non_tensor(row, "extra_info")
    if extra_info is None:
        extra_info = {}
    elif not isinstance(extra_info, Mapping):
        raise ScoringError(f"the sample's extra_info must be a dict, got {type(extra_info).__name__}")
    ids = valid_response_ids(row)
    final = FinalOutput(
        row=row,
        solution_str="",
        data_source=non_tensor(row, "data_source"),
        ground_truth=reward_model["ground_truth"],
        extra_info=copy_value(dict(extra_info)),
        valid_response_length=int(ids.shape[0]),
    )
    return final, ids


def merge_rollout_fields(
    extra_info: dict[str, object], row: TensorDict, *, turns_and_scores: bool = True
) -> dict[str, Any]:
    """Merge the final output's ``extra_fields`` into ``extra_info`` (in place) and return it.

    With ``turns_and_scores`` also set ``extra_info["num_turns"]`` (the output's
    ``num_turns``) and ``extra_info["rollout_reward_scores"]`` (the rollout's
    precomputed reward, ``{}`` when there is none), as verl's naive manager does.
    """
    tool_extra_fields = non_tensor(row, "tool_extra_fields")
    if tool_extra_fields:
        extra_info.update(copy_value(dict(tool_extra_fields)))
    if turns_and_scores:
        extra_info["num_turns"] = non_tensor(row, "__num_turns__")
        extra_info["rollout_reward_scores"] = copy_value(non_tensor(row, "reward_scores", {}))
    return extra_info


async def score_final_output(
    manager: RewardManager, final: FinalOutput, extra_info: dict[str, object]
) -> dict[str, object]:
    """Call the manager's scoring function (or the default one) and normalise the result.

    A scorer exception propagates (the worker records it as an error result); an
    unusable return value raises :class:`~rewardq.errors.ScoringError`.
    """
    result = await manager.call_score_fn(
        manager.compute_score or default_compute_score,
        data_source=final.data_source,
        solution_str=final.solution_str,
        ground_truth=final.ground_truth,
        extra_info=extra_info,
    )
    return normalize_result(result)
