"""A bad output inside ``put_trajectory`` is refused naming the field and the output, once (its key;
an image's error its index beside the image), for every check the producer makes on an output, and
nothing is queued. fakeredis stands in for Redis: nothing here reaches it but the keyspace read."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import msgpack
import numpy as np
import pytest
import torch

from rewardq import AsyncRewardClient, RewardClient
from rewardq.errors import RecordError
from rewardq.producers.jsonl import JsonlLineError, parse_line
from rewardq.queue.clients import blocking
from rewardq.queue.codec import decode_output
from rewardq.queue.keys import Keyspace

GOOD: dict[str, Any] = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5]}
SAMPLE = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "1"}}


def _bad(**fields: Any) -> dict[str, Any]:
    return {**GOOD, **fields}


def _without(name: str) -> dict[str, Any]:
    return {k: v for k, v in GOOD.items() if k != name}


# (what is wrong, the bad output, the field named, a phrase of the detail)
CASES: list[tuple[str, Any, str, str]] = [
    ("negative id", _bad(response_ids=[4, -7]), "response_ids", "token id -7 is negative"),
    ("id past int32", _bad(prompt_ids=[1, 2**31]), "prompt_ids", "out of range"),
    ("id past int64", _bad(prompt_ids=np.array([1, 2**63], dtype=np.uint64)), "prompt_ids", "out of range"),
    ("float ids", _bad(prompt_ids=np.array([1.0, 2.0])), "prompt_ids", "integer token ids"),
    ("float tensor", _bad(response_ids=torch.tensor([1.5])), "response_ids", "integer token ids"),
    ("bool ids", _bad(response_ids=[True, False]), "response_ids", "integer token ids"),
    ("ids as text", _bad(prompt_ids="1 2 3"), "prompt_ids", "got str"),
    ("2-D ids", _bad(prompt_ids=[[1, 2]]), "prompt_ids", "1-D"),
    ("ragged ids", _bad(prompt_ids=[[1], [2, 3]]), "prompt_ids", "cannot be read"),
    ("no prompt_ids", _without("prompt_ids"), "prompt_ids", "is required"),
    ("no response_ids", _without("response_ids"), "response_ids", "is required"),
    ("mask too long", _bad(response_mask=[1, 1, 1]), "response_mask", "3 entries"),
    ("mask not 0/1", _bad(response_mask=[1, 2]), "response_mask", ""),
    ("mask of floats", _bad(response_mask=[0.5, 1.0]), "response_mask", ""),
    ("logprobs too short", _bad(response_logprobs=[-0.1]), "response_logprobs", "1 entries"),
    ("logprobs nan", _bad(response_logprobs=[-0.1, float("nan")]), "response_logprobs", ""),
    ("logprobs text", _bad(response_logprobs=["a", "b"]), "response_logprobs", "must be numbers"),
    ("num_turns negative", _bad(num_turns=-1), "num_turns", "non-negative"),
    ("num_turns float", _bad(num_turns=1.5), "num_turns", "non-negative"),
    ("extra_fields int key", _bad(extra_fields={1: "x"}), "extra_fields", "keys must be strings"),
    ("extra_fields ext", _bad(extra_fields={"x": msgpack.ExtType(9, b"")}), "extra_fields.x", ""),
    ("extra_fields object", _bad(extra_fields={"x": object()}), "extra_fields/sample", "msgpack cannot carry"),
    (
        "int key inside an object array",
        _bad(extra_fields={"x": np.array([{"role": "user"}, {1: "a"}], dtype=object)}),
        "extra_fields.x[1]",
        "keys must be strings",
    ),
    ("reward_score text", _bad(reward_score="1"), "reward_score", "must be a number"),
    ("reward_score nan", _bad(reward_score=float("nan")), "reward_score", "finite"),
    ("reward_score 10**400", _bad(reward_score=10**400), "reward_score", "past a float's range"),
    ("images not a map", _bad(multi_modal_data=["x"]), "multi_modal_data", "must be a"),
    ("image unreadable", _bad(multi_modal_data={"images": ["/no/such/image.png"]}), "multi_modal_data.images[0]", ""),
    ("output None", None, "output", "is None"),
    ("misspelt mask", _bad(respone_mask=[1, 1]), "respone_mask", "did you mean 'response_mask'"),
    ("misspelt ids", _bad(prompt_id=[1]), "prompt_id", "did you mean 'prompt_ids'"),
    ("output a list", [1, 2], "prompt_ids", "is required"),
    ("oversize", _bad(prompt_ids=list(range(1, 300_000))), "<record>", "exceeds max_record_bytes"),
]


def _check(err: RecordError, field: str, detail: str) -> None:
    text = str(err)
    assert err.field == field, text
    # named once: by its key, or (an image's error) by its index beside the image
    named = f"{field}: output 2, " in text if err.names_output else text.endswith(" (output u_s_2)")
    assert text.startswith(f"{field}: ") and named and "u_s_2" not in text[:-15], text
    assert detail in text, text
    assert len(text) < 600, text


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_put_trajectory_names_the_bad_output_and_its_field(case: tuple[str, Any, str, str]) -> None:
    _, bad, field, detail = case
    r = fakeredis.FakeRedis()
    client = RewardClient(blocking(r), namespace="bad", max_record_bytes=1_000_000)
    # Given a trajectory of four outputs whose third (index 2) is bad
    # When it is put whole
    with pytest.raises(RecordError) as err:
        client.put_trajectory("u", "s", [GOOD, GOOD, bad, GOOD], SAMPLE)
    # Then the error names the field and the output's key, and nothing was queued
    _check(err.value, field, detail)
    assert r.xlen(Keyspace("bad").stream(0)) == 0


@pytest.mark.parametrize("case", CASES[:3] + CASES[-3:], ids=[c[0] for c in CASES[:3] + CASES[-3:]])
def test_put_output_and_the_asyncio_client_name_it_the_same_way(case: tuple[str, Any, str, str]) -> None:
    _, bad, field, detail = case
    with pytest.raises(RecordError) as err:
        RewardClient(blocking(fakeredis.FakeRedis()), namespace="bad", max_record_bytes=1_000_000).put_output(
            "u", "s", 2, bad, SAMPLE
        )
    _check(err.value, field, detail)

    async def put() -> None:
        client = AsyncRewardClient(fakeredis.FakeAsyncRedis(), namespace="bad", max_record_bytes=1_000_000)
        try:
            await client.put_trajectory("u", "s", [GOOD, GOOD, bad], SAMPLE)
        finally:
            await client.aclose()

    with pytest.raises(RecordError) as err:
        asyncio.run(put())
    _check(err.value, field, detail)


def test_a_jsonl_line_names_the_output_once() -> None:
    line = '{"uid": "u", "session_id": "s", "sample": {}, "outputs": [{"prompt_ids": [1], "response_ids": [-3]}]}'
    with pytest.raises(JsonlLineError) as err:
        parse_line(line, 7)
    assert "outputs[0].response_ids" in str(err.value) and "token id -3 is negative" in str(err.value)
    assert "output u_s_0" not in str(err.value)


def test_other_fields_of_a_verl_output_pass() -> None:
    # verl's AgentLoopOutput (and its internal form) carries fields the producer does not send
    others = ["routed_experts", "metrics", "mm_processor_kwargs", "mm_processor_output", "input_ids"]
    others += ["position_ids", "attention_mask", "teacher_logprobs", "teacher_ids", "multi_modal_inputs"]
    r = fakeredis.FakeRedis()
    client = RewardClient(blocking(r), namespace="ok", max_record_bytes=1_000_000)
    client.put_trajectory("u", "s", [{**GOOD, **{k: None for k in others}}], SAMPLE)
    assert r.xlen(Keyspace("ok").stream(0)) == 1


def test_an_object_array_of_messages_passes_and_arrives_as_its_list() -> None:
    # verl's non-tensor columns are numpy object arrays: raw_prompt holds the chat messages
    messages = np.array([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], dtype=object)
    r = fakeredis.FakeRedis()
    client = RewardClient(blocking(r), namespace="ok", max_record_bytes=1_000_000)
    client.put_trajectory("u", "s", [GOOD], {**SAMPLE, "raw_prompt": messages})
    [(_, fields)] = blocking(r).xrange(Keyspace("ok").stream(0))
    record = decode_output(fields[b"data"])  # as the worker decodes it
    assert record.sample["raw_prompt"] == messages.tolist()


def test_a_sample_with_a_bad_key_inside_an_object_array_is_refused_before_anything_is_queued() -> None:
    r = fakeredis.FakeRedis()
    client = RewardClient(blocking(r), namespace="bad", max_record_bytes=1_000_000)
    nested = np.array([[{"role": "user"}], [{("a", 1): "tuple key"}]], dtype=object)
    with pytest.raises(RecordError) as err:
        client.put_trajectory("u", "s", [GOOD], {**SAMPLE, "raw_prompt": nested})
    assert err.value.field == "sample.raw_prompt[1][0]" and "keys must be strings" in str(err.value)
    assert r.xlen(Keyspace("bad").stream(0)) == 0
