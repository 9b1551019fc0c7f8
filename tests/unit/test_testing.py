"""``rewardq.testing`` runs a user's manager and scoring function as a worker does, without Redis.

Given the same outputs pushed to a real worker on the real Redis and given to the helpers, the
batch ``make_batch`` builds is the batch the worker handed ``run_single`` and ``score_trajectory``'s
results are the ones the worker wrote; the pipeline's refusals and the worker's checks of a
manager's answer surface as the same errors; and ``score_response`` runs a ``--reward-fn`` in a
scorer process, as the worker does by default.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rewardq import RewardClient
from rewardq.errors import ConfigError, RecordError, ScoringError
from rewardq.reward import RewardManager
from rewardq.reward.base import ManagerContext
from rewardq.reward.tokenizer import load_tokenizer
from rewardq.testing import (
    ManagerRunner,
    make_batch,
    output,
    score_response,
    score_trajectory,
    score_trajectory_sync,
    worker_manager,
)
from tests.support.helpers import SAMPLE, running_workers
from tests.support.helpers import output as random_output
from tests.support.managers import LengthManager

OUTPUTS = [
    random_output(3, 5, seed=1, response_mask=[1, 1, 0, 1, 1], num_turns=2),
    random_output(4, 2, seed=2, extra_fields={"tool": "search"}),
    random_output(2, 3, seed=3),
]


def _plain(value: object) -> object:
    return value.tolist() if hasattr(value, "tolist") else value


async def test_the_batch_and_the_results_are_the_workers(
    ns: str, redis_url: str, length_manager: LengthManager
) -> None:
    # Given a trajectory scored by a real worker on the real Redis
    client = RewardClient.from_url(redis_url, namespace=ns)
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        keys = client.put_trajectory("u", "s", OUTPUTS, SAMPLE)
        written = await asyncio.to_thread(client.wait_rewards, keys, 15)
    (seen,) = LengthManager.calls

    # When the same outputs go through the helpers
    ours = make_batch(OUTPUTS, SAMPLE, uid="u", session_id="s")
    results = await score_trajectory(LengthManager(None), OUTPUTS, SAMPLE)

    # Then the batch holds the same fields with the same values, row by row
    assert set(ours.keys()) == set(seen.keys())
    for key in seen.keys():
        if isinstance(seen[key], torch.Tensor):
            assert torch.equal(ours[key], seen[key]), key
        else:
            assert [_plain(ours[i][key]) for i in range(3)] == [_plain(seen[i][key]) for i in range(3)], key
    # And each key gets the result the worker wrote for it
    assert [(r.status, r.reward_score, r.reward_extra_info) for r in results] == [
        (written[k].status, written[k].reward_score, written[k].reward_extra_info) for k in keys
    ]
    assert [r.key.rsplit("_", 1)[1] for r in results] == ["0", "1", "2"]


def test_text_outputs_use_the_tokenizer_and_round_trip() -> None:
    tok = load_tokenizer("builtin:demo")
    out = output("What is 6 * 7?", "It is 42.", num_turns=3)
    assert tok.decode(out["response_ids"]) == "It is 42." and out["num_turns"] == 3
    assert output([1, 2], [3]) == {"prompt_ids": [1, 2], "response_ids": [3]}


@pytest.mark.parametrize(
    ("bad", "field"),
    [({"prompt_ids": [1], "response_ids": [-3]}, "response_ids"), ({"prompt_ids": [1]}, "response_ids")],
)
def test_what_the_pipeline_refuses_is_refused_naming_the_field(bad: dict[str, list[int]], field: str) -> None:
    with pytest.raises(RecordError) as err:
        make_batch([bad], SAMPLE)
    assert err.value.field == field


def test_a_token_id_past_the_tokenizers_vocabulary_is_refused_as_the_worker_refuses_it() -> None:
    vocab = load_tokenizer("builtin:demo").vocab_size
    with pytest.raises(RecordError, match="vocab"):
        make_batch([{"prompt_ids": [1], "response_ids": [vocab + 5]}], SAMPLE, vocab_size=vocab)


class Answers(RewardManager):
    """Returns whatever it was built with (to see the worker's checks of an answer)."""

    def __init__(
        self,
        tokenizer: Any = None,
        compute_score: Any = None,
        *,
        context: ManagerContext | None = None,
        answer: Any = None,
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        self.answer = answer
        self.events: list[str] = []

    async def setup(self) -> None:
        self.events.append("setup")

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        self.events.append(f"run:{len(data)}")
        result: dict[str, Any] = self.answer
        return result

    async def close(self) -> None:
        self.events.append("close")
        await super().close()


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        ({"reward_score": math.nan}, "finite"),
        ({"score": 1.0}, "reward_score"),
        ([{"reward_score": 1.0}], "returned 1 results for a trajectory of 3 outputs"),
        ("1.0", "must return a dict or a list"),
    ],
)
def test_an_answer_the_worker_refuses_raises_its_message(
    answer: dict[str, Any] | list[dict[str, Any]] | str, match: str
) -> None:
    with pytest.raises(ScoringError, match=match):
        score_trajectory_sync(Answers(answer=answer), OUTPUTS, SAMPLE)


async def test_the_runner_sets_up_once_scores_many_and_closes() -> None:
    manager = Answers(answer={"reward_score": 0.5, "reward_extra_info": {"k": 1}})
    async with ManagerRunner(manager) as run:
        first = await run.score(OUTPUTS[:1], SAMPLE)
        second = await run.score(OUTPUTS, SAMPLE)
    assert manager.events == ["setup", "run:1", "run:3", "close"]
    assert [r.reward_score for r in first + second] == [0.5] * 4 and second[2].reward_extra_info == {"k": 1}
    assert first[0].key != second[0].key  # each trajectory its own session
    with pytest.raises(RuntimeError, match="async with"):
        await ManagerRunner(manager).score(OUTPUTS, SAMPLE)


async def test_a_slow_manager_times_out_as_score_timeout_says() -> None:
    class Slow(Answers):
        async def run_single(self, data: TensorDict) -> dict[str, Any]:
            await asyncio.sleep(30)
            raise AssertionError("the score timeout did not stop a slow manager")

    with pytest.raises(ScoringError, match="timed out after 0.2s"):
        await score_trajectory(Slow(), OUTPUTS, SAMPLE, timeout=0.2)


REWARD_FILE = """
import os

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return {"score": float(solution_str.strip() == ground_truth) + bonus, "pid": os.getpid(),
            "seen": solution_str, "split": (extra_info or {}).get("split")}
"""


async def test_score_response_with_the_default_scorer_of_the_data_source() -> None:
    sample = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "42"}}
    assert (await score_response("so #### 42", sample)).reward_score == 1.0
    assert (await score_response("so #### 41", sample)).reward_score == 0.0


def test_worker_manager_builds_as_the_worker_and_refuses_as_it() -> None:
    assert type(worker_manager("dapo", manager_options={"max_resp_len": 64})).__name__.lower().startswith("dapo")
    with pytest.raises(ConfigError, match="unknown reward manager 'nope'"):
        worker_manager("nope")
    with pytest.raises(ConfigError, match="does not take option"):
        worker_manager("naive", manager_options={"max_rmp": 1})
