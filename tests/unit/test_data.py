"""The demo data generator and the JSONL format (no Redis needed).

The generator's ``expected`` rewards are what the demo and the multi-process tests check
every result against, so they are checked here against the real scoring path: the
default scorer on the decoded final response, and the ``naive`` manager on the batch the
worker would build from the encoded records.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rewardq.consumers.batch import build_batch
from rewardq.demo.data import GSM8K, MATH, make_trajectories
from rewardq.producers.jsonl import JsonlLineError, parse_line, read_jsonl, write_jsonl
from rewardq.queue.codec import decode_output, encode_output
from rewardq.reward.managers.naive import NaiveRewardManager
from rewardq.reward.scoring import default_compute_score
from rewardq.reward.tokenizer import Tokenizer, load_tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer("builtin:demo")


@pytest.fixture(scope="module")
def trajs(tok: Tokenizer) -> list[dict[str, Any]]:
    return make_trajectories(400, seed=21, tokenizer=tok)


def test_same_seed_same_data_other_seed_other_data(tok: Tokenizer) -> None:
    a, b = make_trajectories(30, seed=4, tokenizer=tok), make_trajectories(30, seed=4, tokenizer=tok)
    assert json.dumps(a) == json.dumps(b)
    assert json.dumps(make_trajectories(30, seed=5, tokenizer=tok)) != json.dumps(a)
    assert len(make_trajectories(7, seed=4, tokenizer=tok)) == 7 and make_trajectories(0, tokenizer=tok) == []


def test_expected_rewards_match_the_default_scorer(trajs: list[dict[str, Any]], tok: Tokenizer) -> None:
    for t in trajs:
        final = t["outputs"][-1]
        text = tok.decode(final["response_ids"], skip_special_tokens=True)
        got = default_compute_score(t["sample"]["data_source"], text, t["sample"]["reward_model"]["ground_truth"])
        assert got == t["expected"], (text[-200:], t["sample"]["reward_model"])
    mix = Counter((t["sample"]["data_source"], t["expected"]) for t in trajs)
    assert set(mix) == {(GSM8K, 0.0), (GSM8K, 1.0), (MATH, 0.0), (MATH, 1.0)}
    assert 0.45 < sum(t["expected"] for t in trajs) / len(trajs) < 0.75


async def test_expected_rewards_match_the_naive_manager_on_the_worker_batch(
    trajs: list[dict[str, Any]], tok: Tokenizer
) -> None:
    manager = NaiveRewardManager(tok)
    for t in trajs[:80]:
        n = len(t["outputs"])
        records = [
            decode_output(encode_output(t["uid"], t["session_id"], i, o, t["sample"], final=i == n - 1))
            for i, o in enumerate(t["outputs"])
        ]
        out = await manager.run_single(build_batch(records))
        assert out["reward_score"] == t["expected"]
        assert out["reward_extra_info"] == {"acc": t["expected"]}


def test_trajectories_look_like_multi_turn_agent_rollouts(trajs: list[dict[str, Any]], tok: Tokenizer) -> None:
    lengths = Counter(len(t["outputs"]) for t in trajs)
    assert set(lengths) == {1, 2, 3, 4, 5, 6}
    groups = Counter(t["uid"] for t in trajs)
    assert max(groups.values()) > 1  # GRPO groups: several sessions per prompt
    assert len({(t["uid"], t["session_id"]) for t in trajs}) == len(trajs)
    tool_tokens = 0
    for t in trajs:
        s = t["sample"]
        assert {"data_source", "reward_model", "extra_info", "raw_prompt", "ability", "agent_name"} <= set(s)
        assert s["raw_prompt"][-1]["role"] == "user" and s["reward_model"]["style"] == "rule"
        turns = [o["num_turns"] for o in t["outputs"]]
        assert turns == sorted(turns) and turns[0] >= 2
        for i, o in enumerate(t["outputs"]):
            assert len(o["response_mask"]) == len(o["response_ids"]) > 0
            assert set(o["response_mask"]) <= {0, 1}
            assert {"finish_reason", "tool_calls", "tool_rewards", "turn_scores"} <= set(o["extra_fields"])
            if "response_logprobs" in o:
                assert len(o["response_logprobs"]) == len(o["response_ids"])
            if i:  # each output's prompt is the previous prompt plus the previous response (and maybe a user turn)
                prev = t["outputs"][i - 1]
                assert (
                    o["prompt_ids"][: len(prev["prompt_ids"]) + len(prev["response_ids"])]
                    == prev["prompt_ids"] + prev["response_ids"]
                )
            masked = [x for x, m in zip(o["response_ids"], o["response_mask"]) if m == 0]
            if masked:
                tool_tokens += len(masked)
                assert "<tool_response>" in tok.decode(masked, skip_special_tokens=True)
                assert s["agent_name"] == "tool_agent"
    assert tool_tokens > 1000


def test_jsonl_round_trip(trajs: list[dict[str, Any]], tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    assert write_jsonl(path, trajs[:25]) == 25
    back = list(read_jsonl(path))
    assert [n for n, _ in back] == list(range(1, 26))
    assert [t for _, t in back] == [
        {k: t[k] for k in ("uid", "session_id", "sample", "outputs", "expected")} for t in trajs[:25]
    ]
    write_jsonl(path, trajs[:3], with_expected=False)
    assert all(isinstance(t, dict) and "expected" not in t for _, t in read_jsonl(path))


@pytest.mark.parametrize(
    "mutate, field, reason",
    [
        (lambda d: d.pop("outputs"), "outputs", "is missing"),
        (lambda d: d.update(outputs=[]), "outputs", "non-empty list"),
        (lambda d: d.update(extra=1), "extra", "unknown key"),
        (lambda d: d.update(uid=""), "uid", "must not be empty"),
        (lambda d: d.update(sample=[1]), "sample", "must be an object"),
        (lambda d: d.update(expected="1"), "expected", "must be a number"),
        (lambda d: d["outputs"][-1].update(response_ids=[1.5, 2.0]), "outputs[{last}].response_ids", "integer"),
        (lambda d: d["outputs"][0].update(prompt_ids=[-3]), "outputs[0].prompt_ids", "negative"),
        (
            lambda d: d["outputs"][0].update(response_mask=[2] * len(d["outputs"][0]["response_ids"])),
            "outputs[0].response_mask",
            "only 0",
        ),
        (lambda d: d["outputs"][-1].pop("response_ids"), "outputs[{last}].response_ids", "is required"),
        (lambda d: d["outputs"].append("x"), "outputs[{last}]", "must be an object"),
    ],
)
def test_bad_lines_name_line_and_field(trajs: list[dict[str, Any]], mutate: Any, field: str, reason: str) -> None:
    d = json.loads(json.dumps({k: trajs[0][k] for k in ("uid", "session_id", "sample", "outputs")}))
    mutate(d)
    last = len(d.get("outputs") or [1]) - 1
    with pytest.raises(JsonlLineError) as info:
        parse_line(json.dumps(d), 7)
    assert info.value.line == 7 and info.value.field == field.format(last=last), str(info.value)
    assert reason in info.value.reason


def test_read_jsonl_keeps_going_after_bad_lines(trajs: list[dict[str, Any]], tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    write_jsonl(path, trajs[:4])
    lines = path.read_text().splitlines()
    lines.insert(1, "{not json")
    lines.insert(3, "")
    lines.insert(4, "[1, 2]")
    path.write_text("\n".join(lines) + "\n")
    got = list(read_jsonl(path))
    assert [n for n, _ in got] == [1, 2, 3, 5, 6, 7]
    assert [type(x).__name__ for _, x in got] == ["dict", "JsonlLineError", "dict", "JsonlLineError", "dict", "dict"]
    first, second = got[1][1], got[3][1]
    assert isinstance(first, JsonlLineError) and isinstance(second, JsonlLineError)
    assert first.field == "<json>" and second.reason.startswith("expected a JSON object")
