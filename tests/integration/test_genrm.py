"""The genrm manager against a stand-in OpenAI-compatible server that parses each request and answers
according to it (tests/support/judge_standin.py), with the cache and limiter on the real Redis."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from rewardq.errors import ScoringError
from rewardq.queue.codec import decode_output, encode_output
from rewardq.queue.keys import Keyspace
from rewardq.queue.states import FailureKind, failure_kind_of
from rewardq.reward.base import ManagerContext
from rewardq.reward.judge.cache import judge_totals
from rewardq.reward.judge.client import JudgeUnavailable
from rewardq.reward.managers.genrm import GenRMRewardManager
from tests.support.checks import must, per_output, single
from tests.support.judge_standin import JudgeStandin
from tests.support.managers import MakeManager
from tests.support.records import JUDGED_SAMPLE as SAMPLE
from tests.support.records import TOK, text_output
from tests.support.records import judged_batch as batch
from tests.support.sync_client import SyncClient


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"score_parser": "json"},  # structured output: response_format json_schema
        {"score_parser": "json", "structured_output": False},  # JSON asked for in the prompt
        {"score_parser": "json", "score_field": "verdict.score"},
        {"score_parser": "choice", "choices": [0, 0.25, 0.5, 0.75, 1]},
        {"score_parser": "choice", "choices": [0, 0.25, 0.5, 0.75, 1], "structured_output": False},
    ],
    ids=["regex", "json-structured", "json-text", "json-nested", "choice-structured", "choice-text"],
)
async def test_the_reward_is_the_score_the_answer_implies(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin, options: dict[str, Any]
) -> None:
    m = await genrm(**options)
    graded = single(await m.run_single(batch("thinking", "the answer is 42, grade=0.75")))
    assert graded["reward_score"] == 0.75
    right = single(await m.run_single(batch("thinking", "it is 42")))  # no grade: the stand-in compares with 42
    wrong = single(await m.run_single(batch("thinking", "it is 41")))
    assert (right["reward_score"], wrong["reward_score"]) == (1.0, 0.0)
    info = graded["reward_extra_info"]
    assert info["acc"] == 0.75 and info["judge_cached"] is False and info["judge_votes"] == 1
    assert info["judge_prompt_tokens"] > 0 and info["judge_completion_tokens"] > 0
    bodies = judge.bodies()
    structured = options.get("score_parser") in ("json", "choice") and options.get("structured_output", True)
    assert all(("response_format" in b) == structured for b in bodies)
    assert "What is 6*7?" in bodies[0]["messages"][-1]["content"]  # the question, from raw_prompt


async def test_labels_under_structured_output(genrm: MakeManager[GenRMRewardManager]) -> None:
    m = await genrm(score_parser="choice", choices={"correct": 1, "incorrect": 0})
    assert single(await m.run_single(batch("it is 42")))["reward_score"] == 1.0
    assert single(await m.run_single(batch("it is 7")))["reward_score"] == 0.0


async def test_n_answers_from_one_request_combined_by_mean_or_majority(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin
) -> None:
    mean = await genrm(n=3, temperature=0.8)
    out = single(await mean.run_single(batch("votes=1,0,1")))
    assert out["reward_score"] == pytest.approx(2 / 3) and out["reward_extra_info"]["judge_votes"] == 3
    # the same request body, combined another way: the cached answer, nothing sent again
    majority = await genrm(n=3, temperature=0.8, combine="majority")
    out = single(await majority.run_single(batch("votes=1,0,1")))
    assert out["reward_score"] == 1.0 and out["reward_extra_info"]["judge_cached"] is True
    assert judge.stats()["served"] == 1 and [b["n"] for b in judge.bodies()] == [3]


async def test_rescoring_reuses_the_answer_across_managers_and_workers(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin, sync_redis: SyncClient, ns: str
) -> None:
    first = await genrm(worker="w0")
    second = await genrm(worker="w1")
    data = batch("thinking", "grade=0.5")
    a = single(await first.run_single(data))
    b = single(await second.run_single(data))  # another worker re-scoring the same trajectory
    assert a["reward_score"] == b["reward_score"] == 0.5
    assert (a["reward_extra_info"]["judge_cached"], b["reward_extra_info"]["judge_cached"]) == (False, True)
    assert b["reward_extra_info"]["judge_prompt_tokens"] == a["reward_extra_info"]["judge_prompt_tokens"]
    assert judge.stats()["served"] == 1
    totals = judge_totals(sync_redis, Keyspace(ns))["judge-model"]
    assert (totals["requests"], totals["answers"], totals["cache_hits"]) == (1, 1, 1)
    assert totals["prompt_tokens"] == a["reward_extra_info"]["judge_prompt_tokens"]


async def test_racing_workers_on_one_request_make_one(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin
) -> None:
    judge.control(delay=0.5)
    managers = [await genrm(worker=f"w{i}") for i in range(4)]
    data = batch("grade=1")
    outs = await asyncio.gather(*(m.run_single(data) for m in managers))
    assert [single(o)["reward_score"] for o in outs] == [1.0] * 4
    assert sorted(single(o)["reward_extra_info"]["judge_cached"] for o in outs) == [False, True, True, True]
    assert judge.stats()["served"] == 1


async def test_per_turn_judging_gives_each_output_its_own_reward(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin
) -> None:
    m = await genrm(per_turn=True, prompt_template="{trajectory}\nJudge the last output. {format_instructions}")
    out = per_output(await m.run_single(batch("grade=0.25", "grade=0.5", "grade=1")))
    assert [o["reward_score"] for o in out] == [0.25, 0.5, 1.0]
    texts = sorted((b["messages"][-1]["content"] for b in judge.bodies()), key=len)
    assert [t.count("[output") for t in texts] == [1, 2, 3]  # output i is judged with the trajectory up to it
    assert texts[0].startswith("[output 0]\ngrade=0.25\n")


async def test_a_429_is_a_transient_failure_carrying_its_retry_after(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin
) -> None:
    # the judge sends once and never sleeps: the worker retries in place (the one retry policy)
    judge.control(fail_next=1, status=429, retry_after=7)
    m = await genrm()
    t0 = time.monotonic()
    with pytest.raises(JudgeUnavailable, match=r"answered HTTP 429: injected 429 \(Retry-After: 7s\)") as err:
        await m.run_single(batch("grade=0.5"))
    assert time.monotonic() - t0 < 5.0
    assert failure_kind_of(err.value) is FailureKind.TRANSIENT and err.value.retry_after == 7.0
    assert judge.stats()["statuses"] == {"429": 1}
    assert single(await m.run_single(batch("grade=0.5")))["reward_score"] == 0.5  # the next try is answered


async def test_a_500_is_a_transient_failure_and_the_next_try_scores(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin, sync_redis: SyncClient, ns: str
) -> None:
    judge.control(fail_next=2, status=500)
    m = await genrm()
    for _ in range(2):
        with pytest.raises(JudgeUnavailable, match="answered HTTP 500: injected 500") as err:
            await m.run_single(batch("grade=0.5"))
        assert failure_kind_of(err.value) is FailureKind.TRANSIENT and err.value.retry_after is None
    assert single(await m.run_single(batch("grade=0.5")))["reward_score"] == 0.5
    totals = judge_totals(sync_redis, Keyspace(ns))["judge-model"]
    # a transient failure is an error of the request, not a call refused for good: it is tried again
    assert (totals["requests"], totals["errors"], totals["failed"]) == (3, 2, 0)
    assert totals["error_rate"] == round(2 / 3, 4)


async def test_a_judge_that_is_down_raises_naming_the_status_and_its_message(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin, sync_redis: SyncClient, ns: str
) -> None:
    judge.control(fail_always=500)
    m = await genrm()
    with pytest.raises(JudgeUnavailable, match=r"answered HTTP 500: injected 500") as err:
        await m.run_single(batch("grade=1"))
    assert isinstance(err.value, ScoringError) and err.value.status == 500
    assert judge.stats()["statuses"] == {"500": 1}
    judge.control(fail_always=0)  # back up: the claim was released, nothing was cached
    assert single(await m.run_single(batch("grade=1")))["reward_score"] == 1.0


@pytest.mark.parametrize(
    ("status", "kind"), [(404, FailureKind.CONFIG), (403, FailureKind.CONFIG), (400, FailureKind.SCORER)]
)
async def test_a_refused_request_is_not_transient(
    genrm: MakeManager[GenRMRewardManager],
    judge: JudgeStandin,
    sync_redis: SyncClient,
    ns: str,
    status: int,
    kind: FailureKind,
) -> None:
    m = await genrm()
    with pytest.raises(JudgeUnavailable, match=f"answered HTTP {status}") as err:
        await m.run_single(batch(f"judge-fail={status}"))
    assert failure_kind_of(err.value) is kind
    assert judge.stats()["received"] == 1
    assert judge_totals(sync_redis, Keyspace(ns))["judge-model"]["failed"] == 1  # refused for good


def test_the_retired_retry_options_load_and_are_ignored_with_a_warning(
    judge: JudgeStandin, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="rewardq.reward"):
        GenRMRewardManager(TOK, base_url=judge.base_url, model="m", max_retries=0, max_retry_wait=10)
    (warned,) = [r.getMessage() for r in caplog.records if "no longer" in r.getMessage()]
    assert warned.startswith("genrm: max_retries, max_retry_wait no longer") and "retry_for" in warned


async def test_a_server_without_structured_output_falls_back_to_json_in_text(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin, caplog: pytest.LogCaptureFixture
) -> None:
    judge.control(refuse_structured=True)
    m = await genrm(score_parser="json")
    with caplog.at_level(logging.WARNING, logger="rewardq.reward.genrm"):
        assert single(await m.run_single(batch("grade=0.25")))["reward_score"] == 0.25
        assert single(await m.run_single(batch("grade=0.5")))["reward_score"] == 0.5
    assert sum("does not take response_format" in r.message for r in caplog.records) == 1
    assert judge.stats()["statuses"] == {"400": 1, "200": 2}
    strict = await genrm(score_parser="json", structured_output=True, limiter_name="strict")
    with pytest.raises(JudgeUnavailable, match="HTTP 400"):
        await strict.run_single(batch("grade=0.75"))


async def test_the_api_key_comes_from_the_environment_and_is_never_logged(
    tmp_path: Path, redis_url: str, ns: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-test-" + hashlib.sha256(ns.encode()).hexdigest()[:20]
    keyed = JudgeStandin(tmp_path, api_key=secret)
    try:
        ctx = ManagerContext(redis_url=redis_url, namespace=ns)
        no_key = GenRMRewardManager(TOK, context=ctx, base_url=keyed.base_url, model="m")
        await no_key.setup()
        with pytest.raises(JudgeUnavailable, match="HTTP 401") as err:
            await no_key.run_single(batch("grade=1"))
        assert failure_kind_of(err.value) is FailureKind.CONFIG
        await no_key.close()
        monkeypatch.setenv("MY_JUDGE_KEY", secret)
        with caplog.at_level(logging.DEBUG):
            m = GenRMRewardManager(TOK, context=ctx, base_url=keyed.base_url, model="m", api_key_env="MY_JUDGE_KEY")
            await m.setup()
            assert single(await m.run_single(batch("grade=1")))["reward_score"] == 1.0
            await m.close()
        assert secret not in caplog.text and secret not in repr(m) and secret not in repr(m.judge)
    finally:
        keyed.stop()


async def test_the_token_bucket_is_charged_with_the_servers_usage(
    genrm: MakeManager[GenRMRewardManager], sync_redis: SyncClient, ns: str
) -> None:
    m = await genrm(max_tpm=600_000, estimated_tokens_per_request=1)  # a bucket of 10,000 tokens
    out = single(await m.run_single(batch("grade=1")))
    used = out["reward_extra_info"]["judge_prompt_tokens"] + out["reward_extra_info"]["judge_completion_tokens"]
    level = float(must(sync_redis.hget(Keyspace(ns).ratelimit("genrm"), "b:tpm:tokens")))
    assert 10_000 - used - 1 < level <= 10_000 - used + 200  # refilled a little since; the estimate was 1


async def test_calls_started_together_take_their_estimate_first_and_go_out_as_the_bucket_refills(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin
) -> None:
    # Given max_tpm 60,000 (a bucket of 1,000 tokens, refilled at 1,000 a second), an estimate of
    # 1,000 tokens per call, and a judge that answers after 2 s
    judge.control(delay=2.0)
    m = await genrm(max_tpm=60_000, estimated_tokens_per_request=1000, limiter_name="reserve")
    t0 = time.time()
    # When 8 calls start at once
    outs = await asyncio.gather(*(m.run_single(batch(f"grade=0.{i}")) for i in range(1, 9)))
    # Then each took its estimate before it was sent: they reached the judge about one per refill
    # of the bucket, not all 8 together (checking the bucket only before a call sent them all)
    assert [single(o)["reward_score"] for o in outs] == [i / 10 for i in range(1, 9)]
    arrivals = sorted(e["t"] for e in judge.call("/log") if e["t"] >= t0)
    assert len(arrivals) == 8
    first = sum(1 for t in arrivals if t < arrivals[0] + 0.5)
    assert first <= 2 and arrivals[-1] - arrivals[0] >= 3.0, [round(t - arrivals[0], 2) for t in arrivals]


def png(color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), color).save(buf, format="PNG")
    return buf.getvalue()


async def test_a_vision_judge_receives_the_outputs_images_as_data_urls(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin
) -> None:
    from rewardq.consumers.batch import build_batch

    first, final = png((255, 0, 0)), png((0, 0, 255))
    recs = [
        decode_output(
            encode_output("u", "s", i, {**text_output(r), "multi_modal_data": {"images": [img]}}, SAMPLE, final=i == 1)
        )
        for i, (r, img) in enumerate([("look", first), ("grade=1", final)])
    ]
    m = await genrm()
    assert single(await m.run_single(build_batch(recs)))["reward_score"] == 1.0
    [body] = judge.bodies()
    parts = body["messages"][-1]["content"]
    assert parts[0]["type"] == "image_url" and parts[-1]["type"] == "text"
    url = parts[0]["image_url"]["url"]
    assert url == "data:image/png;base64," + base64.b64encode(final).decode()  # the final output's image
    assert judge.stats()["images"] == [
        {"mime": "image/png", "size": len(final), "sha256": hashlib.sha256(final).hexdigest()}
    ]
    text_only = await genrm(images=False, limiter_name="text")
    await text_only.run_single(build_batch(recs))
    assert isinstance(judge.bodies()[-1]["messages"][-1]["content"], str)


async def test_without_redis_the_cache_and_limits_hold_in_the_process(
    genrm: MakeManager[GenRMRewardManager], judge: JudgeStandin
) -> None:
    m = await genrm(redis=False, max_concurrent=1)
    judge.control(delay=0.2)
    outs = await asyncio.gather(*(m.run_single(batch(f"grade=0.{i}")) for i in range(1, 4)))
    assert [single(o)["reward_score"] for o in outs] == [0.1, 0.2, 0.3]
    assert judge.stats()["max_in_flight"] == 1
    again = single(await m.run_single(batch("grade=0.1")))
    assert again["reward_extra_info"]["judge_cached"] is True and judge.stats()["served"] == 3
