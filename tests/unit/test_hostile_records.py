"""Hostile input stopped where it enters: the producer refuses it naming the field, the decoder
refuses exactly what the producer refuses, keys never cross, and the retry policy never re-sends a
script that may have blocked Redis. No Redis needed."""

from __future__ import annotations

import math
import time
from typing import Any

import msgpack
import numpy as np
import pytest
from redis.exceptions import AuthenticationError, BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rewardq.errors import RecordError
from rewardq.producers.core import prepare_trajectory
from rewardq.queue import retry
from rewardq.queue.checks import MAX_OUTPUTS
from rewardq.queue.codec import decode_output, encode_output, peek_identity
from rewardq.queue.connection import permission_error
from rewardq.queue.digests import legacy_record_digest, record_digest
from rewardq.queue.keys import MAX_SESSION_ID_BYTES, MAX_UID_BYTES, Keyspace, parse_key, trajectory_id
from tests.support.hostile import GOOD, SAMPLE, raw_record

NAN_LP = {"prompt_ids": [1], "response_ids": [1, 2], "response_logprobs": [-0.1, math.nan]}


@pytest.mark.parametrize(
    "uid,sid,index,out,sample,field",
    [
        ("u", "s", 10**12, GOOD, SAMPLE, "index"),
        ("u", "s", MAX_OUTPUTS, GOOD, SAMPLE, "index"),
        ("u", "1_a", 0, GOOD, SAMPLE, "session_id"),
        ("u", "s" * (MAX_SESSION_ID_BYTES + 1), 0, GOOD, SAMPLE, "session_id"),
        ("u" * (MAX_UID_BYTES + 1), "s", 0, GOOD, SAMPLE, "uid"),
        ("u\ud800", "s", 0, GOOD, SAMPLE, "uid"),
        ("u", "s", 0, NAN_LP, SAMPLE, "response_logprobs"),
        ("u", "s", 0, {**GOOD, "response_logprobs": [math.inf, 0.0]}, SAMPLE, "response_logprobs"),
        ("u", "s", 0, {**GOOD, "reward_score": math.nan}, SAMPLE, "reward_score"),
        ("u", "s", 0, {**GOOD, "reward_score": -math.inf}, SAMPLE, "reward_score"),
        ("u", "s", 0, GOOD, {"reward_model": {1: "int key"}}, "sample.reward_model"),
        ("u", "s", 0, GOOD, {"extra_info": {"a": [{(1, 2): "tuple key"}]}}, "sample.extra_info.a[0]"),
        ("u", "s", 0, {**GOOD, "extra_fields": {"t": {None: 1}}}, SAMPLE, "extra_fields.t"),
        ("u", "s", 0, GOOD, {"x": msgpack.ExtType(9, b"")}, "sample.x"),
        ("u", "s", 0, GOOD, {"x": list(range(1_000_001))}, "sample.x"),
        ("u", "s", 0, GOOD, {"x": np.zeros(1_000_001)}, "sample.x"),
    ],
)
def test_producer_refuses_hostile_outputs_naming_the_field(
    uid: Any, sid: Any, index: Any, out: Any, sample: Any, field: str
) -> None:
    with pytest.raises(RecordError) as info:
        encode_output(uid, sid, index, out, sample, final=True)
    assert info.value.field == field, str(info.value)


def test_producer_refuses_a_trajectory_longer_than_max_outputs_and_honours_a_smaller_bound() -> None:
    ks = Keyspace("x")
    with pytest.raises(RecordError, match="at most max_outputs=4096") as info:
        prepare_trajectory(ks, "u", "s", [GOOD] * (MAX_OUTPUTS + 1), SAMPLE, max_bytes=10**8)
    assert info.value.field == "outputs"
    with pytest.raises(RecordError, match="max_outputs=8") as info:
        prepare_trajectory(ks, "u", "s", [GOOD] * 9, SAMPLE, max_bytes=10**8, max_outputs=8)
    with pytest.raises(RecordError, match="max_outputs=8"):
        encode_output("u", "s", 8, GOOD, SAMPLE, final=True, max_outputs=8)
    assert len(prepare_trajectory(ks, "u", "s", [GOOD] * 8, SAMPLE, max_bytes=10**8, max_outputs=8)) == 8


@pytest.mark.parametrize(
    "override,field",
    [
        ({"index": 10**12}, "index"),
        ({"index": MAX_OUTPUTS}, "index"),
        ({"session_id": "1_a"}, "session_id"),
        ({"uid": "u" * (MAX_UID_BYTES + 1)}, "uid"),
        ({"reward_score": math.nan}, "reward_score"),
        ({"reward_score": math.inf}, "reward_score"),
        ({"response_logprobs": msgpack.ExtType(3, np.array([0.0, math.nan], "<f4").tobytes())}, "response_logprobs"),
    ],
)
def test_decoder_rechecks_what_the_producer_checks(override: dict[str, Any], field: str) -> None:
    fields: dict[str, Any] = {"uid": "u", "session_id": "s", **override}
    uid, sid = fields.pop("uid"), fields.pop("session_id")
    with pytest.raises(RecordError) as info:
        decode_output(raw_record(uid, sid, **fields))
    assert info.value.field == field, str(info.value)


NESTED: list[dict[Any, Any]] = [
    {"a": 1},
    {"a": {"b": [1, 2, {"c": None}]}},
    {"a": {1: "x"}},
    {"a": [{2.5: "x"}]},
    {"a": {b"k": "bytes key"}},
    {"a": {True: 1}},
    {"a": list(range(1_000_001))},
    {"a": {str(i): i for i in range(100_001)}},
    {"a": msgpack.ExtType(7, b"x")},
]


def _producer_accepts(sample: dict[Any, Any]) -> bool:
    try:
        encode_output("u", "s", 0, GOOD, sample, final=True)
        return True
    except RecordError:
        return False


def _decoder_accepts(sample: dict[Any, Any]) -> bool:
    try:
        decode_output(raw_record("u", "s", sample=sample))
        return True
    except RecordError:
        return False


@pytest.mark.parametrize("sample", NESTED, ids=range(len(NESTED)))
def test_producer_accepts_exactly_what_the_decoder_accepts(sample: dict[Any, Any]) -> None:
    assert _producer_accepts(sample) == _decoder_accepts(sample)


def test_the_nested_samples_hold_both_verdicts() -> None:
    # the agreement above would hold trivially if every sample were refused (or every one accepted)
    assert {_producer_accepts(s) for s in NESTED} == {True, False}


def test_deep_nesting_is_refused_alike_on_both_sides() -> None:
    deep: object = 1
    for _ in range(1030):
        deep = [deep]
    with pytest.raises(RecordError):
        encode_output("u", "s", 0, GOOD, {"x": deep}, final=True)
    with pytest.raises(RecordError, match="not a valid msgpack record"):
        decode_output(b"\x91" * 5000 + b"\x01")


def test_bytes_that_are_no_msgpack_are_refused_with_a_detail() -> None:
    # msgpack's FormatError for a reserved byte (0xc1) says nothing: the message names the bytes
    with pytest.raises(RecordError) as caught:
        decode_output(b"\xc1\xc1 not msgpack")
    assert "()" not in str(caught.value) and ": )" not in str(caught.value)
    assert "FormatError: its bytes start b'\\xc1\\xc1 not msgpack'" in str(caught.value)


def test_keys_never_cross_and_parse_from_the_right() -> None:
    # the two trajectories of the ambiguity report cannot both exist: the second is refused
    assert trajectory_id("job_1", "a") == "job_1_a"
    with pytest.raises(RecordError, match="session_id"):
        encode_output("job", "1_a", 0, GOOD, SAMPLE, final=True)
    assert parse_key("job_1_a_0") == ("job_1", "a", "0")
    assert parse_key("my_uid_s1_12") == ("my_uid", "s1", "12")
    for bad in ("junk", "u_0", "u_s_", "u_s_007", "u_s_-1", "_s_0", "u__0", "k" * 10_000 + "_s_0", "u_s_1٣"):
        assert parse_key(bad) is None, bad


def test_peek_identity_reads_names_and_marks_a_bad_index_unknown() -> None:
    assert peek_identity(raw_record("u", "s", 10**12)) == ("u", "s", 10**12)
    assert peek_identity(raw_record("u", "s", -1)) == ("u", "s", -1)
    assert peek_identity(raw_record("u", "s", "zero")) == ("u", "s", -1)  # type: ignore[arg-type]  # a bad index is the test
    assert peek_identity(raw_record("u", "1_a", 0)) is None  # not a name a producer may use
    assert peek_identity(b"hello") is None and peek_identity(None) is None


def test_digest_tells_records_apart_and_redeliveries_alike() -> None:
    a = encode_output("u", "s", 0, GOOD, SAMPLE, final=True)
    b = encode_output("u", "s", 0, {**GOOD, "response_ids": [4, 6]}, SAMPLE, final=True)
    assert record_digest(a) == record_digest(bytes(a)) and len(record_digest(a)) == 17
    assert record_digest(a) != record_digest(b)
    # the form earlier versions stored can never be taken for the tagged one
    old = legacy_record_digest(a)
    assert len(old) == 16 and not old.startswith("x") and old != legacy_record_digest(b)


def test_retry_policy_never_resends_a_script_that_may_have_blocked_redis() -> None:
    far = time.monotonic() + 60
    conn = RedisConnectionError("Connection closed by server.")
    # an ordinary command: connection errors and timeouts are sent again, within the bounds
    assert retry.may_resend(conn, failures=1, attempt_s=5.0, deadline=far, script=False)
    assert retry.may_resend(RedisTimeoutError("t"), failures=1, attempt_s=30.0, deadline=far, script=False)
    assert not retry.may_resend(conn, failures=retry.RETRIES + 1, attempt_s=0.0, deadline=far, script=False)
    assert not retry.may_resend(conn, failures=1, attempt_s=0.0, deadline=time.monotonic() - 1, script=False)
    assert not retry.may_resend(AuthenticationError("no"), failures=1, attempt_s=0.0, deadline=far, script=False)
    # a script: only a quick connection error (it cannot have held Redis long); never a timeout
    assert retry.may_resend(conn, failures=1, attempt_s=0.01, deadline=far, script=True)
    assert not retry.may_resend(RedisTimeoutError("t"), failures=1, attempt_s=0.01, deadline=far, script=True)
    assert not retry.may_resend(conn, failures=1, attempt_s=retry.SCRIPT_RESEND_WINDOW, deadline=far, script=True)
    # BUSY is no retryable error type at all: redis-py raises it to the caller at once
    assert not isinstance(ResponseError("BUSY Redis is busy running a script"), retry.RETRY_ON)
    assert retry.is_transient(ResponseError("BUSY Redis is busy")) and retry.is_transient(BusyLoadingError("x"))
    assert not retry.is_transient(ResponseError("WRONGTYPE")) and not retry.is_transient(AuthenticationError("x"))


def test_policy_retry_counts_one_deadline_for_nested_calls_and_marks_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = retry.PolicyRetry()
    calls: list[float] = []
    pauses: list[float] = []  # the backoff's pauses, taken without waiting them out (~6 s)
    monkeypatch.setattr(time, "sleep", pauses.append)  # retry.py sleeps through the time module

    def failing() -> None:
        calls.append(time.monotonic())
        raise RedisTimeoutError("slow")

    with retry.script_call(), pytest.raises(RedisTimeoutError):
        policy.call_with_retry(failing, lambda e: None)
    assert len(calls) == 1  # a script that timed out is never sent again
    calls.clear()

    def unreachable() -> None:
        calls.append(time.monotonic())
        raise RedisConnectionError("x")

    with pytest.raises(RedisConnectionError):
        policy.call_with_retry(unreachable, lambda e: None)
    assert len(calls) == retry.RETRIES + 1 and len(pauses) == retry.RETRIES and 0 < sum(pauses) < retry.DEADLINE
    assert retry.backoff_delay(1) <= retry.BASE and retry.backoff_delay(50) <= retry.CAP


def test_permission_error_is_one_line_naming_the_permission_and_the_key_pattern() -> None:
    exc = ResponseError("NOPERM User rq has no permissions to access the 'ns:meta' key")
    err = permission_error(exc, "ns", "redis://rq:secret@127.0.0.1:6379/0")
    text = str(err)
    assert "\n" not in text and "secret" not in text
    assert "NOPERM User rq has no permissions" in text and "~ns:*" in text and "'rq'" in text
    assert err.exit_code == 2


def test_dead_letter_list_caps_every_column() -> None:
    from rewardq.ops.deadletters.commands import COLUMN_CHARS, _row
    from rewardq.ops.deadletters.stream import DeadLetter

    d = DeadLetter(
        0,
        "1-0",
        {
            "key": b"k" * (5 * 1024 * 1024),
            "tid": b"t" * 10_000,
            "worker": b"w" * 10_000,
            "reason": b"line\n" * 10_000,
            "kind": b"invalid",
            "deliveries": b"9" * 50,
            "data": b"",
        },
    )
    row = _row(d)
    text = {name: str(value) for name, value in row.items()}
    for col, limit in COLUMN_CHARS.items():
        assert len(text[col]) <= limit and "\n" not in text[col], col
    assert row["deliveries"] is None


def test_a_retry_is_worded_from_what_it_did() -> None:
    from rewardq.ops.deadletters.commands import describe_retry
    from rewardq.ops.deadletters.stream import Retried

    assert describe_retry(Retried()) == "nothing to retry (no record and no trajectory); removed"
    assert describe_retry(Retried(tid="u_s", requeued=True)) == "record re-queued"
    kept = Retried("u_s", reopened=True, cleared=2, restored=2, outputs=2, requeued=True)
    assert describe_retry(kept) == "reopened u_s (2 results cleared); 2 kept record(s) restored; record re-queued"
    lost = describe_retry(Retried("u_s", reopened=True, cleared=3, outputs=3, requeued=True))
    assert lost.startswith("reopened u_s (3 results cleared); its other outputs' records were not kept")
