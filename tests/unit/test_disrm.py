"""The ``disrm`` manager against a loopback HTTP server that answers like vLLM and SGLang."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from tensordict import TensorDict

from rewardq.config import translate_verl_reward
from rewardq.errors import ConfigError, ScoringError
from rewardq.reward.factory import build_manager
from rewardq.reward.managers.disrm import DisRMRewardManager
from rewardq.reward.tokenizer import Tokenizer
from tests.support.managers import MakeManager, set_up_managers
from tests.support.records import TOK as POLICY_TOK
from tests.support.records import trajectory_batch
from tests.support.reward_server import FakeRewardServer, rm_tokenizer_folder

RAW_PROMPT = [{"role": "system", "content": "You are a judge."}, {"role": "user", "content": "What is 6*7?"}]
EXPECTED_PROMPT = (
    "<|im_start|>system\nYou are a judge.<|im_end|>\n<|im_start|>user\nWhat is 6*7?<|im_end|>\n"
    "<|im_start|>assistant\nThe answer is 42<|im_end|>\n"
)


@pytest.fixture
def server() -> Iterator[FakeRewardServer]:
    s = FakeRewardServer()
    yield s
    s.close()


@pytest.fixture
def rm_tokenizer_dir(tmp_path: Path) -> str:
    return rm_tokenizer_folder(tmp_path / "rm-tokenizer")


@pytest.fixture
async def make(server: FakeRewardServer, rm_tokenizer_dir: str) -> AsyncIterator[MakeManager[DisRMRewardManager]]:
    def build(**kw: Any) -> DisRMRewardManager:
        options: dict[str, Any] = dict(
            base_url=server.url,
            model="rm-7b",
            backend="vllm",
            tokenizer=rm_tokenizer_dir,
            backoff_base=0.01,
            backoff_cap=0.02,
            timeout=5.0,
        )
        options.update(kw)
        return DisRMRewardManager(POLICY_TOK, None, **options)

    async with set_up_managers(build) as factory:
        yield factory


def trajectory(raw_prompt: Any = RAW_PROMPT, response: str = "The answer is 42") -> TensorDict:
    sample = {"data_source": "rm", "reward_model": {"ground_truth": None}, "raw_prompt": raw_prompt}
    return trajectory_batch("call tool", response, sample=sample, prompt="What is 6*7?", eos=True)


async def test_vllm_classify_request_and_score(make: MakeManager[DisRMRewardManager], server: FakeRewardServer) -> None:
    m = await make(backend="vllm")
    out = await m.run_single(trajectory())
    assert out == {"reward_score": 0.83, "reward_extra_info": {}}
    assert len(server.requests) == 1
    req = server.requests[0]
    assert req["path"] == "/classify" and req["content_type"] == "application/json"
    assert req["json"] == {"model": "rm-7b", "input": EXPECTED_PROMPT, "use_activation": False}


async def test_sglang_embeddings_request_and_score(
    make: MakeManager[DisRMRewardManager], server: FakeRewardServer
) -> None:
    m = await make(backend="sglang")
    out = await m.run_single(trajectory())
    assert out == {"reward_score": -1.25, "reward_extra_info": {}}
    assert [r["path"] for r in server.requests] == ["/v1/embeddings"]
    assert server.requests[0]["json"] == {"model": "rm-7b", "input": EXPECTED_PROMPT}


async def test_server_errors_are_retried_until_success(
    make: MakeManager[DisRMRewardManager], server: FakeRewardServer
) -> None:
    server.script = [(503, "loading"), (500, {"error": "oops"})]
    m = await make()
    assert (await m.run_single(trajectory()))["reward_score"] == 0.83
    assert len(server.requests) == 3
    assert all(r["json"] == server.requests[0]["json"] for r in server.requests)
    assert m.stats()["retries"] == 2


async def test_client_errors_are_not_retried(make: MakeManager[DisRMRewardManager], server: FakeRewardServer) -> None:
    server.script = [(400, {"error": "input is too long for this model"})]
    m = await make()
    with pytest.raises(ScoringError, match="HTTP 400") as info:
        await m.run_single(trajectory())
    assert "input is too long" in str(info.value)
    assert len(server.requests) == 1
    assert m.stats()["retries"] == 0


async def test_retries_run_out(make: MakeManager[DisRMRewardManager], server: FakeRewardServer) -> None:
    server.script = [(502, "bad gateway")] * 10
    m = await make(max_retries=2)
    with pytest.raises(ScoringError, match="after 3 attempts; last: HTTP 502: bad gateway"):
        await m.run_single(trajectory())
    assert len(server.requests) == 3


async def test_backoff_is_exponential_and_capped(
    make: MakeManager[DisRMRewardManager], server: FakeRewardServer
) -> None:
    server.script = [(503, "busy")] * 5
    m = await make(backoff_base=0.1, backoff_cap=0.2, max_retries=5)
    assert (await m.run_single(trajectory()))["reward_score"] == 0.83
    assert len(server.requests) == 6
    # planned sleeps: 0.1, 0.2, 0.2, 0.2, 0.2 (less <= 20 % jitter); uncapped they would add up to 3.1 s
    assert 0.8 * 0.9 <= m.stats()["backoff_seconds"] <= 0.9
    gaps = [b["t"] - a["t"] for a, b in zip(server.requests, server.requests[1:])]
    assert all(gap < 0.2 + 0.5 for gap in gaps), gaps  # the last would be 1.6 s uncapped
    assert gaps[1] >= 0.8 * 0.2 - 0.01 and gaps[0] >= 0.8 * 0.1 - 0.01


async def test_a_request_timeout_is_retried(make: MakeManager[DisRMRewardManager], server: FakeRewardServer) -> None:
    server.script = [("sleep", 1.5)]
    m = await make(timeout=0.3)
    assert (await m.run_single(trajectory()))["reward_score"] == 0.83
    assert len(server.requests) == 2


async def test_connection_refused_is_retried_then_reported(make: MakeManager[DisRMRewardManager]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = await make(base_url=f"http://127.0.0.1:{port}", max_retries=2)
    with pytest.raises(ScoringError, match="after 3 attempts") as info:
        await m.run_single(trajectory())
    assert "Connect" in str(info.value)
    assert m.stats()["requests"] == 3


async def test_an_answer_without_the_score_field_is_an_error(
    make: MakeManager[DisRMRewardManager], server: FakeRewardServer
) -> None:
    server.script = [(200, {"data": [{"embedding": [1.0]}]})]
    m = await make(backend="vllm")
    with pytest.raises(ScoringError, match=r"data\[-1\]\.probs\[-1\]"):
        await m.run_single(trajectory())
    assert len(server.requests) == 1


async def test_a_sample_without_a_chat_prompt_is_an_error(
    make: MakeManager[DisRMRewardManager], server: FakeRewardServer
) -> None:
    m = await make()
    with pytest.raises(ScoringError, match="raw_prompt"):
        await m.run_single(trajectory(raw_prompt="What is 6*7?"))
    assert server.requests == []


def test_built_from_a_verl_reward_model_block(server: FakeRewardServer, rm_tokenizer_dir: str) -> None:
    # verl's keys: model_path (the model served, and its tokenizer) and rollout.name (the engine);
    # the server's URL is rewardq's own option (verl starts the server itself)
    cfg = translate_verl_reward(
        {"reward_model": {"enable": True, "model_path": rm_tokenizer_dir, "rollout": {"name": "sglang"}}}
    )
    options: dict[str, Any] = {**cfg["manager_options"], "base_url": server.url}
    m = build_manager(cfg["manager"], tokenizer=POLICY_TOK, options=options)
    assert isinstance(m, DisRMRewardManager) and m.backend == "sglang"
    assert isinstance(m.rm_tokenizer, Tokenizer) and m.rm_tokenizer.bos_token == "<|endoftext|>"


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"tokenizer": None}, "needs tokenizer="),
        ({"backend": "trtllm"}, "backend"),
        ({"base_url": "localhost:8000"}, "base_url"),
        ({"model": ""}, "model"),
        ({"max_retries": -1}, "max_retries"),
        ({"backoff_cap": 0}, "backoff_cap"),
        ({"timeout": -2}, "timeout"),
        ({"retries": 3}, "does not take option"),
    ],
)
def test_bad_options_are_refused(
    server: FakeRewardServer, rm_tokenizer_dir: str, bad: dict[str, None] | dict[str, int] | dict[str, str], match: str
) -> None:
    options: dict[str, Any] = dict(base_url=server.url, model="rm-7b", tokenizer=rm_tokenizer_dir)
    options.update(bad)
    with pytest.raises(ConfigError, match=match):
        DisRMRewardManager(POLICY_TOK, None, **options)
