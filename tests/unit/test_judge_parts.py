"""The genrm judge's parts without a server: score parsers, the prompt template, option checks,
combining n answers, Retry-After, request digests and server error messages."""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any

import pytest

from rewardq.errors import ConfigError
from rewardq.reward.http import retry_after_seconds
from rewardq.reward.judge.client import JudgeAnswer, request_digest, server_message
from rewardq.reward.judge.parsing import (
    ChoiceParser,
    JsonFieldParser,
    RegexParser,
    Unparsed,
    build_parser,
    find_json_object,
)
from rewardq.reward.judge.prompt import PromptTemplate, chat_messages, question_from
from rewardq.reward.managers.genrm import GenRMRewardManager, combine_scores
from tests.support.checks import must
from tests.support.records import TOK, trajectory_batch


@pytest.mark.parametrize(
    "text,score",
    [
        ("The answer is right.\nScore: 7", 7.0),
        ("**Score:** 0.5", 0.5),
        ("score = -1", -1.0),
        ("First I thought score: 2. On reflection, Final score: 3/10", 3.0),  # the last match wins
        ("SCORE:1", 1.0),
    ],
)
def test_the_regex_parser_reads_the_last_score(text: str, score: float) -> None:
    assert RegexParser().parse(text) == score


def test_the_regex_parser_says_why_it_found_nothing_and_takes_a_named_group() -> None:
    assert isinstance(RegexParser().parse("no verdict here"), Unparsed)
    assert RegexParser(r"verdict (?P<score>\d) of \d").parse("verdict 4 of 5") == 4.0
    with pytest.raises(ConfigError, match="group"):
        RegexParser(r"score \d")
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        RegexParser(r"score (\d")


@pytest.mark.parametrize(
    "text",
    [
        '{"score": 0.25}',
        'Reasoning first.\n```json\n{"score": 0.25, "why": "close"}\n```',
        'I think {"a": 1} is a detail; final: {"score": 0.25}',
        '  {"score": "0.25"}  ',
    ],
)
def test_the_json_parser_finds_the_object_and_the_field(text: str) -> None:
    assert JsonFieldParser("score").parse(text) == 0.25


def unparsed(result: float | Unparsed) -> Unparsed:
    assert isinstance(result, Unparsed), result
    return result


def test_the_json_parser_follows_a_dotted_path_and_names_what_is_missing() -> None:
    assert JsonFieldParser("verdict.score").parse('{"verdict": {"score": 1, "note": {"x": 2}}}') == 1.0
    assert "no field 'verdict.score'" in unparsed(JsonFieldParser("verdict.score").parse('{"score": 1}')).reason
    assert "not a number" in unparsed(JsonFieldParser("score").parse('{"score": [1]}')).reason
    assert "no JSON object" in unparsed(JsonFieldParser("score").parse("Score: 1")).reason
    # the top-level object of the last one, not an object nested in it
    assert find_json_object('{"a": {"b": 1}}') == {"a": {"b": 1}}


def test_the_choice_parser_takes_numbers_or_labels() -> None:
    numbers = ChoiceParser([0, 0.5, 1])
    assert numbers.parse("between 3 and 4, I pick 0.5") == 0.5  # 3 and 4 are no choices
    assert isinstance(numbers.parse("7 out of 10"), Unparsed)
    labels = ChoiceParser({"yes": 1, "no": 0})
    assert labels.parse("Is it right? Not obviously... but YES.") == 1.0
    assert labels.parse("yesterday it was no") == 0.0  # whole words only
    assert isinstance(labels.parse("maybe"), Unparsed)
    with pytest.raises(ConfigError, match="choices"):
        ChoiceParser([])
    with pytest.raises(ConfigError, match="finite number"):
        ChoiceParser({"yes": "high"})


def test_structured_output_asks_for_the_parsers_schema() -> None:
    fmt = build_parser("json", score_regex=None, score_field="verdict.score", choices=None, structured=True)
    schema = must(fmt.response_format())["json_schema"]["schema"]
    assert schema["properties"]["verdict"]["properties"]["score"] == {"type": "number"}
    assert schema["required"] == ["verdict"] and schema["additionalProperties"] is False
    labels = build_parser("choice", score_regex=None, score_field="score", choices={"A": 1, "B": 0}, structured=True)
    leaf = must(labels.response_format())["json_schema"]["schema"]["properties"]["score"]
    assert leaf == {"type": "string", "enum": ["A", "B"]}
    assert labels.parse('{"score": "B"}') == 0.0
    plain = build_parser("choice", score_regex=None, score_field="score", choices=[1, 2, 3], structured=False)
    assert plain.response_format() is None and plain.parse("I say 2") == 2.0
    with pytest.raises(ConfigError, match="structured_output"):
        build_parser("regex", score_regex=None, score_field="score", choices=None, structured=True)
    with pytest.raises(ConfigError, match="choices"):
        build_parser("choice", score_regex=None, score_field="score", choices=None, structured=False)


def test_the_template_fills_known_placeholders_and_leaves_json_braces_alone() -> None:
    t = PromptTemplate('Q: {question}\nA: {response}\nReply {"score": 1} or {{literal}}')
    assert t.used == {"question", "response"}
    assert (
        t.render({"question": "why?", "response": "because"}) == 'Q: why?\nA: because\nReply {"score": 1} or {literal}'
    )
    assert PromptTemplate("{ground_truth}").render({"ground_truth": ["1", 2]}) == '["1", 2]'
    with pytest.raises(ConfigError, match=r"unknown placeholder\(s\) \['answer'\]"):
        PromptTemplate("{answer}")


def test_the_question_is_the_last_user_message_then_extra_info_then_the_prompt() -> None:
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "<image>Find x."}]},
    ]
    assert question_from(chat, {}, lambda: "decoded") == "Find x."
    assert question_from(None, {"question": "What is 2+2?"}, lambda: "decoded") == "What is 2+2?"
    assert question_from(None, {}, lambda: "decoded") == "decoded"


def test_images_go_before_the_text_as_image_url_parts() -> None:
    msgs = chat_messages("sys", "judge this", ["data:image/png;base64,AAA"])
    assert msgs[0] == {"role": "system", "content": "sys"}
    assert msgs[1]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
        {"type": "text", "text": "judge this"},
    ]
    assert chat_messages(None, "t", []) == [{"role": "user", "content": "t"}]


def test_mean_and_majority_of_n_answers() -> None:
    assert combine_scores([1, 0, 1, 1], "mean") == 0.75
    assert combine_scores([1, 0, 1, 1], "majority") == 1.0
    assert combine_scores([1, 0], "majority") == 0.5  # a tie: the mean of the tied scores


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("0.5") == 0.5
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= must(retry_after_seconds(when)) <= 31
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None


def test_the_digest_is_of_the_canonical_body() -> None:
    a: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0.0}
    b = {"temperature": 0.0, "messages": [{"content": "x", "role": "user"}], "model": "m"}
    assert request_digest(a) == request_digest(b)
    assert request_digest(a) != request_digest({**a, "temperature": 0.5})


def test_the_servers_own_message_is_read_from_its_error_body() -> None:
    assert server_message(json.dumps({"error": {"message": "rate limit reached", "type": "x"}})) == "rate limit reached"
    assert server_message(json.dumps({"object": "error", "message": "model not found"})) == "model not found"
    assert server_message("<html>Bad Gateway</html>") == "<html>Bad Gateway</html>"


def test_an_answer_survives_the_cache_round_trip() -> None:
    a = JudgeAnswer(["Score: 1", "Score: 0"], prompt_tokens=12, completion_tokens=4, model="m", finish_reasons=["stop"])
    b = JudgeAnswer.from_json(a.to_json(), cached=True)
    assert (b.contents, b.prompt_tokens, b.completion_tokens, b.model, b.cached) == (a.contents, 12, 4, "m", True)


def genrm(**options: Any) -> GenRMRewardManager:
    return GenRMRewardManager(TOK, **{"base_url": "http://127.0.0.1:9/v1", "model": "judge", **options})


@pytest.mark.parametrize(
    "options,match",
    [
        ({"base_url": "127.0.0.1:8000"}, "base_url"),
        ({"model": ""}, "model"),
        ({"score_parser": "xml"}, "score_parser"),
        ({"n": 0}, "n must be an integer >= 1"),
        ({"temperature": -1}, "temperature"),
        ({"combine": "median"}, "combine"),
        ({"structured_output": "maybe"}, "structured_output"),
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"per_turn": "sometimes"}, "per_turn"),
        ({"prompt_template": "{nothing}"}, "unknown placeholder"),
        ({"prompt_template": "a", "prompt_template_path": "b"}, "not both"),
        ({"api_key_env": "REWARDQ_TEST_NO_SUCH_KEY_VARIABLE"}, "is not set"),
        ({"score_parser": "json", "score_regex": "(x)"}, "score_regex is for score_parser=regex"),
    ],
)
def test_bad_options_fail_at_start_up_naming_the_option(options: dict[str, int] | dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        genrm(**options)


def test_the_prompt_holds_question_response_truth_and_the_trajectory() -> None:
    m = genrm(prompt_template="Q={question}|R={response}|T={ground_truth}|turn={turn}|{trajectory}")
    sample = {"reward_model": {"ground_truth": "42"}, "raw_prompt": [{"role": "user", "content": "What is 6*7?"}]}
    data = trajectory_batch("step one", "step two", "it is 42", sample=sample)
    text, images = m.prompt_for(data, 2)
    assert text.startswith("Q=What is 6*7?|R=it is 42|T=42|turn=2|")
    assert "[output 0]\nstep one\n\n[output 1]\nstep two\n\n[output 2]\nit is 42" in text
    assert images == []
    first, _ = m.prompt_for(data, 0)  # per turn: the trajectory up to the judged output
    assert first.endswith("turn=0|[output 0]\nstep one")


def test_the_request_body_carries_the_sampling_options_and_the_schema() -> None:
    m = genrm(score_parser="json", temperature=0.7, max_tokens=64, n=3, extra_body={"seed": 5})
    body = m.request_body("judge this", [])
    assert body["model"] == "judge" and body["temperature"] == 0.7 and body["max_tokens"] == 64
    assert body["n"] == 3 and body["seed"] == 5
    assert body["response_format"]["type"] == "json_schema"
    plain = genrm().request_body("judge this", [])
    assert "n" not in plain and "response_format" not in plain


def test_an_unreadable_answer_is_an_error_unless_unparsed_score_says_otherwise() -> None:
    from rewardq.errors import ScoringError

    with pytest.raises(ScoringError, match="no readable score"):
        genrm().result_of(JudgeAnswer(["I cannot decide"]))
    out = genrm(unparsed_score=0.0, n=2).result_of(JudgeAnswer(["I cannot decide", "Score: 1"]))
    assert out["reward_score"] == 0.5 and out["reward_extra_info"]["judge_votes"] == 1
