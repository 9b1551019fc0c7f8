"""The built-in managers naive, dapo and gdpo on real batches (build_batch + demo tokenizer)."""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rewardq.consumers.batch import build_batch
from rewardq.errors import ConfigError, ScoringError, UnknownDataSourceError
from rewardq.queue.codec import OutputRecord
from rewardq.reward.managers.dapo import DAPORewardManager
from rewardq.reward.managers.gdpo import GDPORewardManager
from rewardq.reward.managers.naive import NaiveRewardManager
from rewardq.reward.results import check_manager_output
from rewardq.reward.rows import non_tensor
from tests.support import records
from tests.support.records import TOK

GSM8K = {
    "data_source": "openai/gsm8k",
    "reward_model": {"ground_truth": "72", "style": "rule"},
    "extra_info": {"split": "train", "index": 7},
    "raw_prompt": [{"role": "user", "content": "How many?"}],
}


PROMPT = "Natalia sold clips. How many?"


def record(index: int, response: str | list[int], **kw: Any) -> OutputRecord:
    """One output whose response is ``response`` encoded with the demo tokenizer (+ EOS)."""
    return records.record(index, response, **{"sample": GSM8K, "prompt": PROMPT, "eos": True, **kw})


def batch(*responses: str, **kw: Any) -> TensorDict:
    return records.trajectory_batch(*responses, **{"sample": GSM8K, "prompt": PROMPT, "eos": True, **kw})


class Recorder:
    """A sync scoring function that records its keyword arguments."""

    def __init__(self, result: object = 1.0) -> None:
        self.result = result
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> object:
        self.calls.append(copy.deepcopy(kwargs))
        return self.result


# --------------------------------------------------------------------------------------
# naive
# --------------------------------------------------------------------------------------


def test_registered_names() -> None:
    assert NaiveRewardManager.name == "naive"
    assert DAPORewardManager.name == "dapo"
    assert GDPORewardManager.name == "gdpo"


async def test_naive_default_scorer_gsm8k() -> None:
    manager = NaiveRewardManager(TOK)
    assert await manager.run_single(batch("48 + 24 = 72\n#### 72")) == {
        "reward_score": 1.0,
        "reward_extra_info": {"acc": 1.0},
    }
    assert await manager.run_single(batch("48 + 24 = 71\n#### 71")) == {
        "reward_score": 0.0,
        "reward_extra_info": {"acc": 0.0},
    }
    assert await manager.run_single(batch("it is 72")) == {"reward_score": 0.0, "reward_extra_info": {"acc": 0.0}}


async def test_naive_scores_only_the_last_row() -> None:
    scorer = Recorder()
    data = batch("#### 72", "tool call, a much longer first turn #### 72", "final #### 5")
    assert data.batch_size[0] == 3
    out = await NaiveRewardManager(TOK, scorer).run_single(data)
    assert len(scorer.calls) == 1
    assert scorer.calls[0]["solution_str"] == "final #### 5"  # decoded, EOS and padding gone
    assert scorer.calls[0]["data_source"] == "openai/gsm8k" and scorer.calls[0]["ground_truth"] == "72"
    # with the default scorer: the wrong final answer decides, not the right earlier ones
    assert (await NaiveRewardManager(TOK).run_single(data))["reward_score"] == 0.0
    right_last = batch("#### 5", "#### 72")
    assert (await NaiveRewardManager(TOK).run_single(right_last))["reward_score"] == 1.0
    assert check_manager_output(out, 3) == [{"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}] * 3


async def test_naive_extra_info_is_a_merged_copy() -> None:
    sample = copy.deepcopy(GSM8K)
    records = [
        record(0, "turn one", sample=sample, num_turns=2, extra_fields={"tool_calls": 1, "early": True}),
        record(1, "#### 72", sample=sample, final=True, num_turns=4, extra_fields={"tool_calls": 3}, reward_score=0.7),
    ]
    data = build_batch(records, sample)
    before = copy.deepcopy(non_tensor(data[-1:], "extra_info"))

    def mutating_scorer(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any]) -> float:
        seen.append(copy.deepcopy(extra_info))
        extra_info["scribbled"] = True
        return 1.0

    seen: list[dict[str, Any]] = []
    await NaiveRewardManager(TOK, mutating_scorer).run_single(data)
    assert seen == [
        {"split": "train", "index": 7, "tool_calls": 3, "num_turns": 4, "rollout_reward_scores": {"reward_score": 0.7}}
    ]  # final output's fields only
    assert non_tensor(data[-1:], "extra_info") == before == {"split": "train", "index": 7}
    assert sample["extra_info"] == {"split": "train", "index": 7}
    # a second run sees the same thing (verl's in-place mutation would leak "scribbled")
    await NaiveRewardManager(TOK, mutating_scorer).run_single(data)
    assert seen[1] == seen[0]


async def test_naive_without_extra_info_or_rollout_score() -> None:
    sample = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"}}
    scorer = Recorder()
    await NaiveRewardManager(TOK, scorer).run_single(build_batch([record(0, "#### 72", sample=sample, final=True)]))
    assert scorer.calls[0]["extra_info"] == {"num_turns": None, "rollout_reward_scores": {}}


async def test_sync_scorer_runs_off_the_event_loop_and_async_scorer_is_awaited() -> None:
    threads = []

    def sync_fn(**kw: Any) -> float:
        threads.append(threading.current_thread())
        return 0.5

    async def async_fn(**kw: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        threads.append(threading.current_thread())
        return {"score": 0.25, "judge": "ok"}

    assert (await NaiveRewardManager(TOK, sync_fn).run_single(batch("x")))["reward_score"] == 0.5
    out = await NaiveRewardManager(TOK, async_fn).run_single(batch("x"))
    assert out == {"reward_score": 0.25, "reward_extra_info": {"score": 0.25, "judge": "ok"}}
    assert threads[0] is not threading.main_thread() and threads[1] is threading.main_thread()


@pytest.mark.parametrize(
    "result, expected",
    [
        (
            {"score": 1.0, "acc": True, "pred": "72"},
            {"reward_score": 1.0, "reward_extra_info": {"score": 1.0, "acc": True, "pred": "72"}},
        ),
        (0.75, {"reward_score": 0.75, "reward_extra_info": {"acc": 0.75}}),
        (1, {"reward_score": 1.0, "reward_extra_info": {"acc": 1}}),
        (True, {"reward_score": 1.0, "reward_extra_info": {"acc": True}}),
        (np.float32(0.5), {"reward_score": 0.5, "reward_extra_info": {"acc": 0.5}}),
        (torch.tensor(2.0), {"reward_score": 2.0, "reward_extra_info": {"acc": 2.0}}),
        (
            {"score": np.float64(-1.0), "format": 0.5},
            {"reward_score": -1.0, "reward_extra_info": {"score": -1.0, "format": 0.5}},
        ),
    ],
)
async def test_result_normalisation(result: Any, expected: dict[str, Any]) -> None:
    out = await NaiveRewardManager(TOK, Recorder(result)).run_single(batch("x"))
    assert out == expected
    assert type(out["reward_score"]) is float
    assert type(out["reward_extra_info"]) is dict


@pytest.mark.parametrize(
    "result, match",
    [
        ({"acc": 1.0}, "without 'score'"),
        (float("nan"), "finite"),
        (10**400, r"^the return value is an integer of about 400 digits, larger than any float"),
        ({"score": -(10**5000)}, r"^score is an integer of about 5,000 digits, larger than any float"),
        ("1.0", "must be a number"),
        (torch.tensor([1.0, 2.0]), "array"),
    ],
)
async def test_unusable_results_raise_scoring_error(result: Any, match: str) -> None:
    with pytest.raises(ScoringError, match=match):
        await NaiveRewardManager(TOK, Recorder(result)).run_single(batch("x"))


async def test_scorer_exception_propagates() -> None:
    def boom(**kw: Any) -> None:
        raise RuntimeError("judge is down")

    with pytest.raises(RuntimeError, match="judge is down"):
        await NaiveRewardManager(TOK, boom).run_single(batch("x"))


async def test_naive_with_dapo_math_and_unknown_sources() -> None:
    dapo_sample = {"data_source": "aime2024", "reward_model": {"ground_truth": "33"}, "extra_info": {}}
    out = await NaiveRewardManager(TOK).run_single(batch("so the total is 34.\nAnswer: 34", sample=dapo_sample))
    assert out == {"reward_score": -1.0, "reward_extra_info": {"score": -1.0, "acc": False, "pred": "34"}}
    unknown = dict(GSM8K, data_source="my/new-dataset")
    with pytest.raises(UnknownDataSourceError, match="my/new-dataset"):
        await NaiveRewardManager(TOK).run_single(batch("#### 72", sample=unknown))


async def test_missing_ground_truth_or_bad_extra_info() -> None:
    with pytest.raises(ScoringError, match="ground_truth"):
        await NaiveRewardManager(TOK).run_single(batch("x", sample={"data_source": "openai/gsm8k"}))
    with pytest.raises(ScoringError, match="extra_info must be a dict"):
        await NaiveRewardManager(TOK).run_single(batch("x", sample=dict(GSM8K, extra_info="oops")))


def test_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="max_resp_len"):
        NaiveRewardManager(TOK, max_resp_len=3)  # type: ignore[call-arg]  # the unknown option is the test


# --------------------------------------------------------------------------------------
# dapo
# --------------------------------------------------------------------------------------

OVERLONG = {"enable": True, "len": 2, "penalty_factor": 1.0, "log": True}


def ids_batch(*lengths: int, response_mask: list[int] | None = None) -> TensorDict:
    """Responses of exactly the given token lengths (no EOS), last one final."""
    n = len(lengths)
    return build_batch(
        [
            record(
                i,
                [100 + j for j in range(length)],
                final=i == n - 1,
                eos=False,
                response_mask=response_mask if i == n - 1 else None,
            )
            for i, length in enumerate(lengths)
        ]
    )


@pytest.mark.parametrize("length, penalty", [(4, -1.0), (3, -0.5), (2, 0.0), (1, 0.0), (5, -1.5)])
async def test_dapo_overlong_penalty_reference_example(length: int, penalty: float) -> None:
    manager = DAPORewardManager(TOK, Recorder(0.5), overlong_buffer=OVERLONG, max_resp_len=4)
    out = await manager.run_single(ids_batch(length))
    assert out["reward_score"] == 0.5 + penalty
    assert out["reward_extra_info"] == {"acc": 0.5, "overlong_reward": penalty, "overlong": penalty < 0}
    assert type(out["reward_extra_info"]["overlong_reward"]) is float


async def test_dapo_uses_the_final_rows_valid_length() -> None:
    manager = DAPORewardManager(TOK, Recorder(1.0), overlong_buffer=OVERLONG, max_resp_len=4)
    # earlier rows are longer (so the final row is padded); only the final row's 3 tokens count
    assert (await manager.run_single(ids_batch(10, 9, 3)))["reward_score"] == 0.5
    # tool/observation tokens (mask 0) are part of the valid response
    masked = ids_batch(4, response_mask=[1, 0, 0, 1])
    assert (await manager.run_single(masked))["reward_score"] == 0.0


async def test_dapo_without_log_disabled_or_unset() -> None:
    quiet = DAPORewardManager(TOK, Recorder(0.5), overlong_buffer=dict(OVERLONG, log=False), max_resp_len=4)
    assert await quiet.run_single(ids_batch(4)) == {"reward_score": -0.5, "reward_extra_info": {"acc": 0.5}}
    off = DAPORewardManager(TOK, Recorder(0.5), overlong_buffer=dict(OVERLONG, enable=False), max_resp_len=4)
    assert await off.run_single(ids_batch(4)) == {"reward_score": 0.5, "reward_extra_info": {"acc": 0.5}}
    unset = DAPORewardManager(TOK, Recorder(0.5))
    assert await unset.run_single(ids_batch(100)) == {"reward_score": 0.5, "reward_extra_info": {"acc": 0.5}}


async def test_dapo_dict_result_keeps_components_and_unpenalised_score() -> None:
    result = {"score": 1.0, "acc": True, "pred": "72"}
    manager = DAPORewardManager(TOK, Recorder(result), overlong_buffer=OVERLONG, max_resp_len=4)
    out = await manager.run_single(ids_batch(4))
    assert out == {
        "reward_score": 0.0,
        "reward_extra_info": {"score": 1.0, "acc": True, "pred": "72", "overlong_reward": -1.0, "overlong": True},
    }


async def test_dapo_extra_info_is_the_datasets_unchanged() -> None:
    sample = copy.deepcopy(GSM8K)
    scorer = Recorder()
    data = build_batch(
        [record(0, "#### 72", sample=sample, final=True, num_turns=3, extra_fields={"t": 1}, reward_score=0.2)]
    )
    await DAPORewardManager(TOK, scorer).run_single(data)
    assert scorer.calls[0]["extra_info"] == {"split": "train", "index": 7}  # no merge, no num_turns


async def test_dapo_default_scorer_end_to_end() -> None:
    sample = {"data_source": "math_dapo", "reward_model": {"ground_truth": "72"}, "extra_info": {}}
    manager = DAPORewardManager(TOK, overlong_buffer=dict(OVERLONG, len=4), max_resp_len=8)
    data = batch("48 + 24 = 72\nAnswer: 72", sample=sample)
    n_tokens = int(non_tensor(data[-1:], "response_len"))
    penalty = min(-(n_tokens - 4) / 4, 0)
    out = await manager.run_single(data)
    assert penalty < 0
    assert out["reward_score"] == pytest.approx(1.0 + penalty)
    assert out["reward_extra_info"]["pred"] == "72" and out["reward_extra_info"]["overlong"] is True


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(overlong_buffer=OVERLONG), "max_resp_len is not set"),
        (dict(overlong_buffer=dict(OVERLONG, len=0), max_resp_len=4), "len must be positive.*got 0"),
        (dict(overlong_buffer=dict(OVERLONG, len=-3), max_resp_len=4), "got -3"),
        (dict(overlong_buffer=OVERLONG, max_resp_len=1), "max_resp_len=1 is smaller than overlong_buffer.len=2"),
        (dict(overlong_buffer=dict(OVERLONG, lenght=2), max_resp_len=4), "does not take \\['lenght'\\]"),
        (dict(overlong_buffer=dict(OVERLONG, enable="yes"), max_resp_len=4), "enable must be true or false"),
        (dict(overlong_buffer=dict(OVERLONG, len=2.5), max_resp_len=4), "len must be an integer"),
        (dict(overlong_buffer=dict(OVERLONG, penalty_factor=-1), max_resp_len=4), "penalty_factor must be >= 0"),
        (dict(overlong_buffer=[2, 1.0], max_resp_len=4), "must be a dict"),
        (dict(max_resp_len=0), "max_resp_len must be a positive integer"),
    ],
)
def test_dapo_rejects_bad_config_at_start_up(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DAPORewardManager(TOK, **kwargs)


def test_dapo_accepts_disabled_buffer_without_max_resp_len() -> None:
    manager = DAPORewardManager(TOK, overlong_buffer={"enable": False, "len": 0})
    assert manager.overlong_buffer is not None
    assert manager.overlong_buffer.enable is False and manager.max_resp_len is None
    with pytest.raises(TypeError, match="overlong_buffer_cfg"):
        DAPORewardManager(TOK, overlong_buffer_cfg=OVERLONG)  # type: ignore[call-arg]  # verl's name is the test


# --------------------------------------------------------------------------------------
# gdpo
# --------------------------------------------------------------------------------------


async def test_gdpo_keeps_every_component_and_adds_experiment_name() -> None:
    components = {"score": 1.25, "format_reward": 0.5, "accuracy_reward": 1.0, "length_reward": -0.25}
    scorer = Recorder(components)
    data = build_batch([record(0, "first"), record(1, "#### 72", final=True, num_turns=2, extra_fields={"calls": 1})])
    out = await GDPORewardManager(TOK, scorer, experiment_name="gdpo-run-3").run_single(data)
    assert out == {"reward_score": 1.25, "reward_extra_info": components}
    assert scorer.calls[0]["extra_info"] == {
        "split": "train",
        "index": 7,
        "calls": 1,
        "num_turns": 2,
        "rollout_reward_scores": {},
        "experiment_name": "gdpo-run-3",
    }
    assert scorer.calls[0]["solution_str"] == "#### 72"
    assert non_tensor(data[-1:], "extra_info") == {"split": "train", "index": 7}


async def test_gdpo_default_experiment_name_and_validation() -> None:
    scorer = Recorder()
    await GDPORewardManager(TOK, scorer).run_single(batch("#### 72"))
    assert scorer.calls[0]["extra_info"]["experiment_name"] == ""
    with pytest.raises(ConfigError, match="experiment_name"):
        GDPORewardManager(TOK, experiment_name=3)  # type: ignore[arg-type]  # the wrong type is the test
