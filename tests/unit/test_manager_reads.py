"""What a manager reads decides the batch it gets: the built-in managers (``reads = "final"``) get the
final output's row only, every other manager the whole trajectory (REFERENCE.md §2/§3)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rewardq.consumers.batch import build_batch
from rewardq.consumers.scorer import TrajectoryScorer
from rewardq.errors import ConfigError
from rewardq.queue.codec import OutputRecord
from rewardq.reward.base import RewardManager
from rewardq.reward.managers.dapo import DAPORewardManager
from rewardq.reward.managers.disrm import DisRMRewardManager
from rewardq.reward.managers.gdpo import GDPORewardManager
from rewardq.reward.managers.limited import LimitedRewardManager
from rewardq.reward.managers.naive import NaiveRewardManager
from rewardq.reward.managers.remote import RemoteRewardManager
from rewardq.reward.results import reads_of
from rewardq.reward.rows import last_row, non_tensor, valid_prompt_ids, valid_response_ids
from tests.support import records
from tests.support.records import TOK

GSM8K = {
    "data_source": "openai/gsm8k",
    "reward_model": {"ground_truth": "72", "style": "rule"},
    "extra_info": {"split": "train", "index": 7},
}


def trajectory(*responses: str) -> list[OutputRecord]:
    n = len(responses)
    return [
        records.record(
            i,
            text,
            sample=GSM8K,
            final=i == n - 1,
            prompt="Q? " * (3 * i + 1),  # every row a different width
            eos=True,
            num_turns=i + 1,
            extra_fields={"turn": i},
        )
        for i, text in enumerate(responses)
    ]


class Seen:
    """Mixed into a manager: keeps the batch ``run_single`` received."""

    batches: list[TensorDict]

    async def run_single(self, data: Any) -> Any:
        self.batches.append(data)
        return await super().run_single(data)  # type: ignore[misc]


class SeenNaive(Seen, NaiveRewardManager):
    """Overrides run_single without declaring ``reads``: must get the whole trajectory."""


class FinalNaive(Seen, NaiveRewardManager):
    reads = "final"


class WholeTrajectory(RewardManager):
    async def run_single(self, data: Any) -> dict[str, Any]:
        return {"reward_score": float(data.batch_size[0]), "reward_extra_info": {}}


@pytest.mark.parametrize(
    "cls",
    [
        NaiveRewardManager,
        DAPORewardManager,
        GDPORewardManager,
        LimitedRewardManager,
        RemoteRewardManager,
        DisRMRewardManager,
    ],
)
def test_every_built_in_manager_reads_the_final_output(cls: type[RewardManager]) -> None:
    assert reads_of(object.__new__(cls)) == "final"


def test_custom_managers_read_the_trajectory_unless_they_say_so() -> None:
    assert reads_of(object.__new__(WholeTrajectory)) == "trajectory"
    assert reads_of(object.__new__(SeenNaive)) == "trajectory"  # a subclass that overrides run_single
    assert reads_of(object.__new__(FinalNaive)) == "final"

    class Wrong(WholeTrajectory):
        reads = "last"

        async def run_single(self, data: Any) -> dict[str, Any]:
            return {}

    with pytest.raises(ConfigError, match="reads must be one of trajectory, final"):
        reads_of(object.__new__(Wrong))


async def test_a_custom_manager_gets_every_output() -> None:
    recs = trajectory("one", "two two", "#### 72")
    scorer = TrajectoryScorer(WholeTrajectory(TOK), manager_name="w", worker_name="t", timeout=5)
    results = (await scorer.score(recs)).results
    assert [r.reward_score for r in results] == [3.0, 3.0, 3.0]


@pytest.mark.parametrize("n", [1, 2, 4])
async def test_a_final_reading_manager_gets_the_final_row_as_data_minus_one_slice_gives_it(n: int) -> None:
    recs = trajectory(*[f"turn {i} " * (i + 1) for i in range(n - 1)], "so #### 72")
    full = last_row(build_batch(recs))
    final = FinalNaive(TOK)
    final.batches = []
    whole = SeenNaive(TOK)
    whole.batches = []
    got = (await TrajectoryScorer(final, manager_name="n", worker_name="t", timeout=5).score(recs)).results
    want = (await TrajectoryScorer(whole, manager_name="n", worker_name="t", timeout=5).score(recs)).results
    assert [(r.reward_score, r.reward_extra_info) for r in got] == [(r.reward_score, r.reward_extra_info) for r in want]
    assert got[0].reward_score == 1.0 and len(got) == n
    [lazy] = final.batches
    assert lazy.batch_size[0] == 1 and whole.batches[0].batch_size[0] == n
    assert torch.equal(valid_response_ids(lazy), valid_response_ids(full))
    assert torch.equal(valid_prompt_ids(lazy), valid_prompt_ids(full))
    for column in ("data_source", "reward_model", "extra_info", "__num_turns__", "tool_extra_fields", "response_len"):
        assert non_tensor(last_row(lazy), column) == non_tensor(full, column), column
