"""The batch a manager receives (layout in rewardq.consumers.batch): per-row fields, and the cheap paths.

``build_batch`` uses tensordict's flat-stack helpers and ``last_row`` a hand-built one-row
batch; each is checked here against what the public tensordict API gives (``data[-1:]``,
``NonTensorStack`` of ``NonTensorData``), with tensordict's fast path, the by-hand builders that
a tensordict without it (0.10) gets, and the public path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

import rewardq.reward.rows as rows_mod
from rewardq.consumers.batch import build_batch
from rewardq.queue.codec import OutputRecord, decode_output, encode_output
from rewardq.reward.rows import (
    last_row,
    non_tensor,
    non_tensor_column,
    valid_prompt_ids,
    valid_response_ids,
)
from tests.support.checks import must

SAMPLE: dict[str, Any] = {
    "data_source": "openai/gsm8k",
    "reward_model": {"ground_truth": "42", "style": "rule"},
    "extra_info": {"split": "test", "index": 7},
    "raw_prompt": [{"role": "user", "content": "what is 6*7?"}],
    "tags": ["a", "b"],
}


def records(
    lengths: list[tuple[int, int]], *, logprobs: bool = False, sample: dict[str, Any] = SAMPLE
) -> list[OutputRecord]:
    rng = np.random.default_rng(0)
    out = []
    n = len(lengths)
    for i, (pl, rl) in enumerate(lengths):
        mask = np.ones(rl, dtype=np.int32)
        mask[rl // 3 : rl // 2] = 0  # a tool span
        output: dict[str, Any] = {
            "prompt_ids": rng.integers(3, 900, pl, dtype=np.int32),
            "response_ids": rng.integers(3, 900, rl, dtype=np.int32),
            "response_mask": mask,
            "num_turns": 2 * i + 2,
            "extra_fields": {"turn": i, "tools": ["search"] * i},
        }
        if logprobs:
            output["response_logprobs"] = -rng.random(rl).astype(np.float32)
        if i == 1:
            output["reward_score"] = 0.25
        out.append(decode_output(encode_output("u", "s", i, output, sample, final=i == n - 1)))
    return out


@pytest.fixture(params=["fast-path", "by-hand", "public-reads", "public-api"])
def fast(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    # fast-path: this tensordict's own (0.15's private helpers); by-hand: what a tensordict without
    # them (0.10) gets once the import probe passed; public-reads: values read through tensorclass's
    # attributes, not straight from where they are held; public-api: the constructors and those reads
    if request.param in ("public-reads", "public-api"):
        monkeypatch.setattr(rows_mod, "DIRECT_READS", False)
    if request.param == "public-api":
        monkeypatch.setattr(rows_mod, "FAST_PATH", False)
    elif request.param == "by-hand":
        monkeypatch.setattr(rows_mod, "_flat_ntd", rows_mod._ntd_by_hand)
        monkeypatch.setattr(rows_mod, "_flat_stack", rows_mod._stack_by_hand)
    result: bool = request.param != "public-api"
    return result


LENGTHS = [(5, 9), (3, 0), (8, 4), (1, 12)]


def test_layout_left_padded_prompts_right_padded_responses(fast: bool) -> None:
    recs = records(LENGTHS, logprobs=True)
    td = build_batch(recs)
    P, R = 8, 12
    assert td.batch_size == torch.Size([4])
    for name, shape in [
        ("prompts", (4, P)),
        ("responses", (4, R)),
        ("response_mask", (4, R)),
        ("attention_mask", (4, P + R)),
        ("input_ids", (4, P + R)),
        ("position_ids", (4, P + R)),
    ]:
        assert tuple(td[name].shape) == shape, name
        assert td[name].dtype == torch.int64, name
    assert td["rollout_log_probs"].dtype == torch.float32
    for i, rec in enumerate(recs):
        pl, rl = LENGTHS[i]
        assert td["prompts"][i, : P - pl].eq(0).all() and td["prompts"][i, P - pl :].tolist() == rec.prompt_ids.tolist()
        assert td["responses"][i, :rl].tolist() == rec.response_ids.tolist() and td["responses"][i, rl:].eq(0).all()
        att = td["attention_mask"][i]
        assert att.tolist() == [0] * (P - pl) + [1] * pl + [1] * rl + [0] * (R - rl)
        assert td["input_ids"][i].tolist() == td["prompts"][i].tolist() + td["responses"][i].tolist()
        pos = td["position_ids"][i]
        assert pos.tolist() == [0] * (P - pl) + list(range(pl + rl)) + [max(pl + rl - 1, 0)] * (R - rl)
        assert td["response_mask"][i, :rl].tolist() == must(rec.response_mask).tolist()
        assert td["response_mask"][i, rl:].eq(0).all()
        assert np.allclose(td["rollout_log_probs"][i, :rl].numpy(), must(rec.response_logprobs))
        # the valid ids of every row, by the batch's own masks and by the helpers
        assert td["responses"][i][att[P:].bool()].tolist() == rec.response_ids.tolist()
        assert valid_response_ids(td[i]).tolist() == rec.response_ids.tolist()
        assert valid_response_ids(td[i : i + 1]).tolist() == rec.response_ids.tolist()
        assert valid_prompt_ids(td[i]).tolist() == rec.prompt_ids.tolist()


def test_no_logprobs_column_when_no_output_has_them() -> None:
    assert "rollout_log_probs" not in build_batch(records(LENGTHS)).keys()


def test_non_tensor_columns_are_per_row_and_independent(fast: bool) -> None:
    recs = records(LENGTHS)
    td = build_batch(recs)
    for i, _rec in enumerate(recs):
        row = td[i]
        assert row["data_source"] == "openai/gsm8k"
        assert row["reward_model"] == SAMPLE["reward_model"]
        assert row["raw_prompt"] == SAMPLE["raw_prompt"] and isinstance(row["raw_prompt"], list)
        assert row["tags"] == ["a", "b"]
        assert row["__num_turns__"] == 2 * i + 2
        assert row["tool_extra_fields"] == {"turn": i, "tools": ["search"] * i}
        assert row["reward_scores"] == ({"reward_score": 0.25} if i == 1 else {})
        assert row["prompt_len"] == LENGTHS[i][0] and row["response_len"] == LENGTHS[i][1]
    # each row owns its copy: mutating one row's dict touches neither the others nor the sample
    td[0]["extra_info"]["index"] = -1
    td[0]["raw_prompt"].append({"role": "assistant", "content": "x"})
    assert td[1]["extra_info"]["index"] == 7 and len(td[1]["raw_prompt"]) == 1
    assert SAMPLE["extra_info"]["index"] == 7 and len(SAMPLE["raw_prompt"]) == 1
    assert td.get("tags").tolist() == [["a", "b"]] * 4


def test_non_tensor_column_matches_the_public_construction(fast: bool) -> None:
    values = [{"a": 1}, [1, 2], "x", 3, None, 2.5]
    column = non_tensor_column(values)
    assert column.tolist() == values
    assert [column[i].data for i in range(len(values))] == values
    td = TensorDict({"t": torch.arange(6)}, batch_size=[6])
    td["v"] = column
    assert [td[i]["v"] for i in range(6)] == values
    assert td[2:4]["v"] == ["x", 3]


def test_by_hand_columns_have_the_constructors_attributes() -> None:
    # the import probe passes on this tensordict, and what it compares can fail: a member built
    # with a different attribute set is told apart
    assert rows_mod._by_hand_matches()
    value = {"ground_truth": "42"}
    by_hand = rows_mod._stack_by_hand([rows_mod._ntd_by_hand(value, None)])
    public = NonTensorStack(NonTensorData(data=value))
    assert rows_mod._state(by_hand) == rows_mod._state(public)
    member = by_hand.tensordicts[0]
    assert type(member) is NonTensorData and member.data is value and member.batch_size == torch.Size([])
    object.__setattr__(member, "_is_initialized", False)
    assert rows_mod._state(by_hand) != rows_mod._state(public)


@pytest.mark.parametrize("lengths", [[(4, 6)], [(5, 9), (3, 0)], LENGTHS, [(2, 0), (2, 0)]])
def test_last_row_is_data_minus_one_slice(fast: bool, lengths: list[tuple[int, int]]) -> None:
    td = build_batch(records(lengths, logprobs=True))
    cheap, ref = last_row(td), td[-1:]
    assert type(cheap) is type(ref) and cheap.batch_size == ref.batch_size == torch.Size([1])
    assert sorted(cheap.keys()) == sorted(ref.keys())
    for key in ref.keys():
        assert isinstance(key, str)
        a, b = cheap.get(key), ref.get(key)
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), key
        else:
            assert type(a) is type(b) and a.tolist() == b.tolist(), key
            assert cheap[0][key] == ref[0][key] and non_tensor(cheap, key) == non_tensor(ref, key), key
    assert valid_response_ids(cheap).tolist() == valid_response_ids(ref).tolist()
    # views like data[-1:]: writing a tensor through the row writes the batch
    cheap["prompts"][0, -1] = 99
    assert td["prompts"][-1, -1] == 99
    # one-row batches pass through; other containers take the general path
    assert last_row(cheap) is cheap


def test_last_row_falls_back_for_nested_tensordicts() -> None:
    td = build_batch(records(LENGTHS))
    td["nested"] = TensorDict({"x": torch.arange(4)}, batch_size=[4])
    row = last_row(td)
    assert row["nested", "x"].tolist() == [3]
    assert row["data_source"] == ["openai/gsm8k"]


def test_direct_reads_are_what_tensordicts_own_reads_give(fast: bool) -> None:
    # the import probe found them equal here; and every column of a row reads the same either way,
    # a column a manager replaced (a plain stack of its own, one shared value) included
    assert rows_mod._plain_data_matches()
    td = build_batch(records(LENGTHS))
    td.set_non_tensor("experiment", {"name": "exp-1"})
    td["labels"] = NonTensorStack(*[NonTensorData(data={"row": i}) for i in range(4)])
    for row in (last_row(td), td[1:2], td[3]):
        for key in row.keys():
            value = row.get(key)
            if isinstance(value, torch.Tensor) or not isinstance(key, str):
                continue
            public = value.data if isinstance(value, NonTensorData) else value.tolist()
            public = public[0] if isinstance(value, NonTensorStack) and row.batch_dims == 1 else public
            assert non_tensor(row, key) == public, key
    assert rows_mod._plain_data(NonTensorData(data=[1], batch_size=[1])) is rows_mod._MISSING  # batched: not plain
    assert rows_mod._plain_data({"data": 1}) is rows_mod._MISSING


def test_non_tensor_reads_rows_and_shared_values() -> None:
    td = build_batch(records(LENGTHS))
    td.set_non_tensor("experiment", "exp-1")  # one value for every row
    assert non_tensor(td[2], "extra_info") == SAMPLE["extra_info"]
    assert non_tensor(td[1:2], "tool_extra_fields") == {"turn": 1, "tools": ["search"]}
    assert non_tensor(last_row(td), "experiment") == "exp-1" and non_tensor(td[0], "experiment") == "exp-1"
    assert non_tensor(td[0], "absent", "dflt") == "dflt"
    with pytest.raises(ValueError, match="one row"):
        non_tensor(td, "data_source")


@pytest.mark.parametrize("drop", ["response_len", "prompt_len"])
def test_valid_ids_without_length_columns_read_the_attention_mask(fast: bool, drop: str) -> None:
    # Given a built batch, and the same batch without one of its length columns (as a
    # hand-built batch of a custom pipeline would be)
    recs = records(LENGTHS)
    td = build_batch(recs)
    bare = td.exclude(drop)
    assert drop not in bare.keys()
    # Then the valid ids come out the same from the lengths and from the attention mask,
    # for data[i] and for a one-row slice
    for i, rec in enumerate(recs):
        for row in (bare[i], bare[i : i + 1], td[i], last_row(td[: i + 1])):
            assert valid_response_ids(row).tolist() == rec.response_ids.tolist()
            assert valid_prompt_ids(row).tolist() == rec.prompt_ids.tolist()
    # And a row of several is refused
    with pytest.raises(ValueError, match="one row"):
        valid_response_ids(td[:2])


@pytest.mark.parametrize("lengths", [(5, 9), (0, 7), (6, 0), (0, 0)])
@pytest.mark.parametrize("logprobs", [False, True])
def test_one_output_batch_is_the_general_layout(lengths: tuple[int, int], logprobs: bool) -> None:
    # Given one output (the final row a built-in manager reads is built on its own)
    (rec,) = records([lengths], logprobs=logprobs)
    # When its batch is built alone, and as the last of two identical rows (the general path)
    alone, general = build_batch([rec]), build_batch([rec, rec])[-1:]
    # Then every tensor is the same: values, dtype, shape, and each its own writable copy
    for key in general.keys():
        if isinstance(general[key], torch.Tensor):
            assert alone[key].dtype == general[key].dtype and torch.equal(alone[key], general[key]), key
    assert set(alone.keys()) == set(general.keys())
    ptrs = {alone[k].data_ptr() for k in alone.keys() if isinstance(alone[k], torch.Tensor) and alone[k].numel()}
    assert len(ptrs) == sum(1 for k in alone.keys() if isinstance(alone[k], torch.Tensor) and alone[k].numel())
