"""Every error result says what kind of failure it is: decided at the source, stored, read back.

The kind comes from the exception's class or its raiser (:func:`failure_kind_of`), from the dead
letter's kind where no exception says it (:data:`DEAD_LETTER_FAILURE`), or from an HTTP status
(:func:`status_failure_kind`); it survives the hop out of a scorer process; and a result hash
holding it reads back as the same member on :class:`RewardResult`.
"""

from __future__ import annotations

import asyncio
import json

import pytest

import rewardq
from rewardq.errors import (
    CodeSandboxError,
    ConfigError,
    MissingExtra,
    MissingScorerExtra,
    RecordError,
    RedisConnectionLost,
    ResultError,
    SandboxUnavailableError,
    ScoringError,
    ScoringTimeout,
    TokenizerMismatch,
    TrajectoryTooLarge,
    TransientError,
    UnknownDataSourceError,
)
from rewardq.queue.results import MAX_ERROR_EXTRA_BYTES, RewardResult, error_extra_info
from rewardq.queue.states import DEAD_LETTER_FAILURE, DeadLetterKind, FailureKind, failure_kind_of
from rewardq.reward.execution.isolation import task_value
from rewardq.reward.execution.scorer_process import _call
from rewardq.reward.execution.scorer_slot import TaskResult
from rewardq.reward.http import status_failure_kind
from rewardq.reward.judge.client import JudgeUnavailable


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (UnknownDataSourceError("no scorer for data_source 'x'"), FailureKind.CONFIG),
        (MissingScorerExtra("pip install 'rewardq[math]'"), FailureKind.CONFIG),
        (MissingExtra("PIL"), FailureKind.CONFIG),
        (CodeSandboxError("namespaces are not available"), FailureKind.CONFIG),
        (ConfigError("bad option"), FailureKind.CONFIG),
        (TokenizerMismatch("another vocabulary"), FailureKind.CONFIG),
        (ScoringTimeout("past score_timeout"), FailureKind.TIMEOUT),
        (TransientError("judge down"), FailureKind.TRANSIENT),
        (SandboxUnavailableError("connection refused"), FailureKind.TRANSIENT),
        (RedisConnectionLost("gone", keys=[], written=None), FailureKind.TRANSIENT),
        (ConnectionRefusedError("refused"), FailureKind.TRANSIENT),
        (RecordError("prompt_ids", "not an array"), FailureKind.INPUT),
        (TrajectoryTooLarge("over max_batch_bytes"), FailureKind.INPUT),
        (ScoringError("the manager returned nothing"), FailureKind.SCORER),
        (ResultError("reward_extra_info holds a cycle"), FailureKind.SCORER),
        (ValueError("a bug in the reward function"), FailureKind.SCORER),
        (TimeoutError("the reward function's own timeout"), FailureKind.SCORER),
        # the raiser's word beats the class's
        (ScoringError("judge answered 401", failure_kind="config"), FailureKind.CONFIG),
        (CodeSandboxError("uids all held", failure_kind=FailureKind.TRANSIENT), FailureKind.TRANSIENT),
        (SandboxUnavailableError("HTTP 403", failure_kind="config"), FailureKind.CONFIG),
        (ScoringError("a kind nobody knows", failure_kind="weird"), FailureKind.SCORER),
    ],
)
def test_the_kind_is_decided_by_the_class_or_the_raiser(exc: BaseException, kind: FailureKind) -> None:
    assert failure_kind_of(exc) is kind


def test_redis_being_away_is_transient_and_a_refused_password_is_not() -> None:
    import redis.exceptions as rex

    assert failure_kind_of(rex.ConnectionError("Connection refused")) is FailureKind.TRANSIENT
    assert failure_kind_of(rex.TimeoutError("Timeout reading")) is FailureKind.TRANSIENT
    assert failure_kind_of(rex.ResponseError("BUSY Redis is busy running a script")) is FailureKind.TRANSIENT
    assert failure_kind_of(rex.AuthenticationError("invalid password")) is FailureKind.SCORER
    assert failure_kind_of(rex.ResponseError("WRONGTYPE")) is FailureKind.SCORER


def test_every_dead_letter_kind_has_a_failure_kind() -> None:
    assert set(DEAD_LETTER_FAILURE) == set(DeadLetterKind)
    assert DEAD_LETTER_FAILURE[DeadLetterKind.INVALID] is FailureKind.INPUT
    assert DEAD_LETTER_FAILURE[DeadLetterKind.CONFLICT] is FailureKind.INPUT
    assert DEAD_LETTER_FAILURE[DeadLetterKind.INCOMPLETE] is FailureKind.INPUT
    assert DEAD_LETTER_FAILURE[DeadLetterKind.TOKENIZER] is FailureKind.CONFIG
    assert DEAD_LETTER_FAILURE[DeadLetterKind.CRASHED] is FailureKind.TRANSIENT
    assert DEAD_LETTER_FAILURE[DeadLetterKind.EXHAUSTED] is FailureKind.TRANSIENT
    assert DEAD_LETTER_FAILURE[DeadLetterKind.SCORING] is FailureKind.SCORER


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (None, FailureKind.TRANSIENT),
        (408, FailureKind.TRANSIENT),
        (429, FailureKind.TRANSIENT),
        (500, FailureKind.TRANSIENT),
        (503, FailureKind.TRANSIENT),
        (599, FailureKind.TRANSIENT),
        (401, FailureKind.CONFIG),
        (403, FailureKind.CONFIG),
        (404, FailureKind.CONFIG),
        (400, FailureKind.SCORER),
        (413, FailureKind.SCORER),
        (422, FailureKind.SCORER),
        (200, FailureKind.SCORER),  # answered, but not what a judge answers
    ],
)
def test_an_http_answer_says_its_kind(status: int | None, kind: FailureKind) -> None:
    assert status_failure_kind(status) is kind
    judge = JudgeUnavailable("judge failed", status=status, retry_after=3.0)
    assert failure_kind_of(judge) is kind and judge.retry_after == 3.0


def test_the_kind_crosses_the_scorer_process_hop() -> None:
    """A scorer process replies with the kind its exception said; the worker's side raises it again."""

    def unknown(**kw: object) -> None:
        raise UnknownDataSourceError("no default scorer for data_source 'x'")

    def judge_down(**kw: object) -> None:
        raise TransientError("the judge answered 503", retry_after=7.5)

    def buggy(**kw: object) -> None:
        raise KeyError("score")

    for fn, kind, retry_after in (
        (unknown, FailureKind.CONFIG, None),
        (judge_down, FailureKind.TRANSIENT, 7.5),
        (buggy, FailureKind.SCORER, None),
    ):
        status, task_id, message, tb, sent_kind, sent_retry = _call(fn, 1, {})
        assert (status, task_id, sent_kind, sent_retry) == ("error", 1, kind.value, retry_after)
        result = TaskResult(status, message=message, traceback=tb, failure_kind=sent_kind, retry_after=sent_retry)
        with pytest.raises(ScoringError) as raised:
            task_value(result)
        assert failure_kind_of(raised.value) is kind and raised.value.retry_after == retry_after
        assert message.split(":")[0] in {"UnknownDataSourceError", "TransientError", "KeyError"}
        assert str(raised.value) == message
    with pytest.raises(ScoringTimeout) as timed_out:
        task_value(TaskResult("timeout", pid=7, message="2s"))
    assert failure_kind_of(timed_out.value) is FailureKind.TIMEOUT


def test_a_stored_error_result_reads_back_with_its_kind() -> None:
    for kind in FailureKind:
        stored = RewardResult(
            key="u_s_0",
            status="error",
            reward_score=None,
            reward_extra_info={"error": "why"},
            error="why",
            failure_kind=kind,
        ).to_hash()
        assert stored["failure_kind"] == kind.value
        back = RewardResult.from_hash("u_s_0", {k.encode(): v.encode() for k, v in stored.items()})
        assert back.failure_kind is kind and back.as_dict()["failure_kind"] == kind.value
        assert json.loads(json.dumps(back.as_dict()))["failure_kind"] == kind.value
    ok = RewardResult(key="u_s_0", status="ok", reward_score=1.0, reward_extra_info={"acc": 1.0}).to_hash()
    assert "failure_kind" not in ok  # an ok result stores no kind: its hash is what it always was
    assert RewardResult.from_hash("k", {b"status": b"ok"}).failure_kind is None
    assert RewardResult.from_hash("k", {b"status": b"error", b"failure_kind": b"weird"}).failure_kind is None
    assert rewardq.FailureKind is FailureKind and rewardq.TransientError is TransientError


def test_an_errors_extra_info_keeps_the_managers_fields_and_stays_bounded() -> None:
    assert error_extra_info("why", None) == b"" and error_extra_info("why", {}) == b""
    stored = json.loads(error_extra_info("timed out", {"timeout": True, "acc": 0.0, "error": "old"}))
    assert stored == {"timeout": True, "acc": 0.0, "error": "timed out"}  # the reason wins
    assert error_extra_info("why", {"pad": "x" * (MAX_ERROR_EXTRA_BYTES + 1)}) == b""  # too big: {"error": why}
    assert error_extra_info("why", {"cycle": [asyncio]}) != b""  # odd values are written as text, never fail
