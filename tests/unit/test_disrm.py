"""The ``disrm`` manager against a loopback HTTP server that answers like vLLM and SGLang."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from tensordict import TensorDict

from rewardq.errors import ConfigError, ScoringError, TransientError
from rewardq.queue.states import FailureKind, failure_kind_of
from rewardq.reward.factory import build_manager
from rewardq.reward.managers.disrm import DisRMRewardManager
from rewardq.reward.tokenizer import Tokenizer
from rewardq.verl_config import translate_verl_reward
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


@pytest.mark.parametrize("status", [503, 500, 429, 408])
async def test_a_server_error_is_a_transient_failure_sent_once(
    make: MakeManager[DisRMRewardManager], server: FakeRewardServer, status: int
) -> None:
    # the worker retries it in place (the one retry policy): the manager never sends twice
    server.script = [(status, "loading")]
    m = await make()
    with pytest.raises(ScoringError, match=f"HTTP {status}: loading") as info:
        await m.run_single(trajectory())
    assert failure_kind_of(info.value) is FailureKind.TRANSIENT
    assert len(server.requests) == 1 and m.stats() == {"requests": 1, "errors": 1}
    assert (await m.run_single(trajectory()))["reward_score"] == 0.83  # the next try is scored


@pytest.mark.parametrize(
    ("status", "kind"), [(400, FailureKind.SCORER), (401, FailureKind.CONFIG), (404, FailureKind.CONFIG)]
)
async def test_a_client_error_is_not_transient(
    make: MakeManager[DisRMRewardManager], server: FakeRewardServer, status: int, kind: FailureKind
) -> None:
    server.script = [(status, {"error": "input is too long for this model"})]
    m = await make()
    with pytest.raises(ScoringError, match=f"HTTP {status} \\(not retried\\)") as info:
        await m.run_single(trajectory())
    assert "input is too long" in str(info.value) and failure_kind_of(info.value) is kind
    assert len(server.requests) == 1


async def test_a_request_timeout_is_transient(make: MakeManager[DisRMRewardManager], server: FakeRewardServer) -> None:
    server.script = [("sleep", 1.5)]
    m = await make(timeout=0.3)
    with pytest.raises(TransientError, match="did not answer"):
        await m.run_single(trajectory())
    assert len(server.requests) == 1


async def test_connection_refused_is_transient(make: MakeManager[DisRMRewardManager]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = await make(base_url=f"http://127.0.0.1:{port}")
    with pytest.raises(TransientError, match="did not answer") as info:
        await m.run_single(trajectory())
    assert "Connect" in str(info.value)
    assert m.stats()["requests"] == 1


def test_the_retired_retry_options_are_accepted_and_ignored_with_a_warning(
    server: FakeRewardServer, rm_tokenizer_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="rewardq.reward"):
        DisRMRewardManager(
            POLICY_TOK, None, base_url=server.url, model="m", tokenizer=rm_tokenizer_dir, max_retries=2, backoff_cap=1
        )
    (warned,) = [r.getMessage() for r in caplog.records if "no longer" in r.getMessage()]
    assert warned.startswith("disrm: backoff_cap, max_retries no longer") and "retry_for" in warned


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
