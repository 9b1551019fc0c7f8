"""Limits both ends check alike: key lengths in bytes, response masks, a field given twice, a
trajectory's total size, a batch's padded size; and the reasons a worker gives when they are hit.
No Redis needed."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import numpy as np
import pytest
from tensordict import TensorDict

from rewardq.consumers.batch import batch_bytes, build_batch, check_batch_bytes
from rewardq.consumers.failures import exhausted_reason
from rewardq.consumers.scorer import TrajectoryScorer
from rewardq.errors import RecordError, ScoringError, TrajectoryTooLarge
from rewardq.producers.core import prepare_trajectory
from rewardq.queue.checks import MAX_OUTPUTS
from rewardq.queue.codec import OutputRecord, decode_output, encode_output, peek_identity
from rewardq.queue.entries import Entry
from rewardq.queue.keys import MAX_KEY_BYTES, MAX_SESSION_ID_BYTES, MAX_UID_BYTES, Keyspace, output_key, parse_key
from rewardq.reward.base import RewardManager
from tests.support.checks import must
from tests.support.hostile import GOOD, SAMPLE, raw_record

CJK = "漢"  # three bytes of UTF-8


# -- keys count bytes, at both ends ---------------------------------------------------------------
def test_a_uid_within_the_limit_in_characters_but_over_it_in_bytes_is_refused_by_the_producer() -> None:
    uid = "abcdef" + CJK * 114  # 120 characters, 348 bytes
    with pytest.raises(RecordError) as info:
        encode_output(uid, "s", 0, GOOD, SAMPLE, final=True)
    assert info.value.field == "uid" and "348 bytes of UTF-8 (120 characters)" in str(info.value)
    assert f"at most {MAX_UID_BYTES} bytes" in str(info.value)


def test_the_longest_multibyte_key_the_producer_accepts_reads_back_whole_at_the_worker() -> None:
    uid = "a" + CJK * ((MAX_UID_BYTES - 1) // 3)  # 256 bytes
    sid = "b" * MAX_SESSION_ID_BYTES
    index = MAX_OUTPUTS - 1
    data = encode_output(uid, sid, index, GOOD, SAMPLE, final=True)
    key = output_key(uid, sid, index)
    assert len(key.encode()) <= MAX_KEY_BYTES
    entry = Entry(0, "1-0", {b"key": key.encode(), b"data": data})
    rec = decode_output(entry.data)
    assert entry.key == rec.key == key  # the worker's check "entry key matches the record's" holds
    assert parse_key(entry.key) == (uid, sid, str(index))


def test_a_key_field_over_the_byte_limit_is_cut_and_never_parsed_as_a_key() -> None:
    long_key = "u" + CJK * 200 + "_s_0"
    entry = Entry(0, "1-0", {b"key": long_key.encode()})
    assert len(entry.key.encode()) > MAX_KEY_BYTES and parse_key(entry.key) is None
    assert parse_key(CJK * 90 + "_s_0") is None  # 270 bytes of uid: over MAX_UID_BYTES


# -- response masks: both ends refuse the same values -------------------------------------------------
@pytest.mark.parametrize("value", [2, 7, -1, 255])
def test_a_mask_value_other_than_0_or_1_is_refused_at_both_ends(value: int) -> None:
    mask = [1, value, 0]
    with pytest.raises(RecordError, match=f"holds {value}") as info:
        encode_output(
            "u", "s", 0, {"prompt_ids": [1], "response_ids": [1, 2, 3], "response_mask": mask}, SAMPLE, final=True
        )
    assert info.value.field == "response_mask"
    for dtype, code in (("<i4", 1), ("u1", 4)):
        arr = np.array(mask, dtype="<i4").astype(dtype)
        raw = raw_record(
            "u",
            "s",
            response_ids=msgpack.ExtType(1, np.array([1, 2, 3], "<i4").tobytes()),
            response_mask=msgpack.ExtType(code, arr.tobytes()),
        )
        if dtype == "u1" and value < 0:
            value_seen = int(arr[1])  # -1 as a byte is 255: refused as well
            with pytest.raises(RecordError, match=f"holds {value_seen}"):
                decode_output(raw)
            continue
        with pytest.raises(RecordError, match=f"holds {value}") as info:
            decode_output(raw)
        assert info.value.field == "response_mask"


def test_masks_of_0_and_1_pass_as_lists_bools_and_int32_at_both_ends() -> None:
    out: dict[str, Any] = {"prompt_ids": [1], "response_ids": [1, 2, 3]}
    for mask in ([1, 0, 1], np.array([True, False, True]), np.array([1, 0, 1], dtype=np.int32)):
        rec = decode_output(encode_output("u", "s", 0, {**out, "response_mask": mask}, SAMPLE, final=True))
        assert rec.response_mask is not None and rec.response_mask.tolist() == [1, 0, 1]
    raw = raw_record(
        "u",
        "s",
        response_ids=msgpack.ExtType(1, np.array([1, 2], "<i4").tobytes()),
        response_mask=msgpack.ExtType(1, np.array([0, 1], "<i4").tobytes()),
    )
    assert must(decode_output(raw).response_mask).tolist() == [0, 1]


# -- a field given twice ----------------------------------------------------------------------------------
def _twice(field: str, first: object, second: object) -> bytes:
    """A record map holding ``field`` twice (msgpack keeps the last; a reader stopping early sees the first)."""
    good = msgpack.unpackb(raw_record("u", "s"), raw=False, ext_hook=lambda c, b: msgpack.ExtType(c, b))
    items = [(k, v) for k, v in good.items() if k != field]
    items = [(field, first), *items, (field, second)]
    packer = msgpack.Packer(use_bin_type=True)
    result: bytes = packer.pack_map_header(len(items)) + b"".join(packer.pack(k) + packer.pack(v) for k, v in items)
    return result


def test_a_record_with_a_field_twice_is_refused_as_ambiguous() -> None:
    for field, a, b in (("uid", "first", "second"), ("index", 0, 1), ("sample", {}, {"x": 1})):
        with pytest.raises(RecordError, match="a field is given twice") as info:
            decode_output(_twice(field, a, b))
        assert info.value.field == "<record>"


def test_an_identity_given_twice_with_two_values_is_no_identity() -> None:
    assert peek_identity(_twice("uid", "first", "second")) is None
    assert peek_identity(_twice("index", 0, 3)) is None
    assert peek_identity(_twice("uid", "same", "same")) == ("same", "s", 0)


def test_peek_identity_still_reads_a_record_whose_ids_pass_the_peeked_bytes() -> None:
    big = {"prompt_ids": list(range(1, 40_000)), "response_ids": [1]}
    assert peek_identity(encode_output("u", "s", 3, big, SAMPLE, final=True)) == ("u", "s", 3)


# -- trajectory and batch sizes -----------------------------------------------------------------------
def test_put_trajectory_refuses_a_trajectory_over_max_trajectory_bytes_before_encoding_it_all() -> None:
    ks = Keyspace("x")
    out: dict[str, Any] = {"prompt_ids": np.arange(1, 100_001), "response_ids": [1]}  # ~400 kB each
    with pytest.raises(TrajectoryTooLarge) as info:
        prepare_trajectory(ks, "u", "s", [out] * 40, SAMPLE, max_bytes=10**7, max_trajectory_bytes=2_000_000)
    text = str(info.value)
    assert info.value.field == "outputs" and "max_trajectory_bytes=2,000,000" in text
    assert "the first 5 of its 40 outputs encode to" in text
    assert (
        len(prepare_trajectory(ks, "u", "s", [out] * 4, SAMPLE, max_bytes=10**7, max_trajectory_bytes=2_000_000)) == 4
    )


def _records(*shapes: tuple[int, int], logprobs: bool = False) -> list[OutputRecord]:
    recs = []
    for i, (p, r) in enumerate(shapes):
        out: dict[str, Any] = {"prompt_ids": np.ones(p, dtype=np.int64), "response_ids": np.ones(r, dtype=np.int64)}
        if logprobs:
            out["response_logprobs"] = np.zeros(r, dtype=np.float32)
        recs.append(decode_output(encode_output("u", "s", i, out, SAMPLE, final=i == len(shapes) - 1)))
    return recs


@pytest.mark.parametrize("logprobs", [False, True])
def test_batch_bytes_is_what_build_batch_allocates(logprobs: bool) -> None:
    recs = _records((3, 5), (7, 2), (1, 9), logprobs=logprobs)
    td = build_batch(recs)
    allocated = sum(td[k].numel() * td[k].element_size() for k in td.keys() if hasattr(td[k], "element_size"))
    assert batch_bytes(recs) == allocated


def test_a_batch_padded_past_max_batch_bytes_is_refused_before_it_is_built() -> None:
    recs = _records(*[(1, 1)] * 40, (1, 1_000_000))  # one long response makes every row that long
    size = batch_bytes(recs)
    assert size > 41 * 1_000_000 * 8 * 5
    with pytest.raises(TrajectoryTooLarge) as info:
        check_batch_bytes(recs, 100 * 1024 * 1024)
    assert "max_batch_bytes=104,857,600" in str(info.value) and "41 outputs padded to 1 prompt and 1,000,000" in str(
        info.value
    )
    check_batch_bytes(recs[:40], 100 * 1024 * 1024)


# -- every trajectory ends: what the manager raises instead of returning -------------------------------
class Raises(RewardManager):
    def __init__(self, exc: BaseException) -> None:
        super().__init__(None)
        self.exc = exc

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        raise self.exc


class AwaitsACancelledTask(RewardManager):
    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        task = asyncio.ensure_future(asyncio.sleep(10))
        task.cancel()
        await task  # its CancelledError escapes run_single: nobody cancelled the worker's task
        raise AssertionError("a cancelled task's await returned")


class MyBaseException(BaseException):
    pass


@pytest.mark.parametrize(
    "manager, reason",
    [
        (Raises(asyncio.CancelledError()), "raised CancelledError although the worker did not cancel it"),
        (AwaitsACancelledTask(None), "raised CancelledError although the worker did not cancel it"),
        (Raises(GeneratorExit()), "raised GeneratorExit, a BaseException that is not an Exception"),
        (Raises(MyBaseException("odd")), "raised MyBaseException, a BaseException that is not an Exception: odd"),
        (Raises(SystemExit(3)), "called sys.exit(3)"),
        (Raises(KeyboardInterrupt()), "raised KeyboardInterrupt"),
    ],
)
async def test_whatever_a_manager_raises_instead_of_returning_is_a_scoring_error(manager: Any, reason: str) -> None:
    scorer = TrajectoryScorer(manager, manager_name="m", worker_name="w", timeout=30)
    with pytest.raises(ScoringError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        await scorer.score(_records((2, 2)))


async def test_the_workers_own_cancellation_passes_through() -> None:
    class Hangs(RewardManager):
        async def run_single(self, data: TensorDict) -> dict[str, Any]:
            await asyncio.sleep(3600)
            raise AssertionError("the worker's cancellation did not reach the manager")

    scorer = TrajectoryScorer(Hangs(None), manager_name="m", worker_name="w", timeout=30)
    task = asyncio.ensure_future(scorer.score(_records((2, 2))))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- exhausted: a crash is named only when an attempt never reported back -----------------------------
def test_an_exhausted_trajectory_whose_commits_failed_blames_no_crash() -> None:
    reason = exhausted_reason(6, 5, {"attempts": 5, "unfinished": 5, "last_failure": "its commit failed (X: y)"})
    assert "delivered 6 times without an answer (max_deliveries=5)" in reason
    assert "5 attempt(s) failed without a result, the last because its commit failed (X: y)" in reason
    assert "died" not in reason and "crash" not in reason


def test_an_exhausted_trajectory_whose_workers_died_says_so_and_counts_them() -> None:
    reason = exhausted_reason(6, 5, {"attempts": 4, "unfinished": 1, "last_failure": "its commit failed (X)"})
    assert "3 scoring attempt(s) never reported back: the worker scoring it died" in reason
    assert "1 attempt(s) failed without a result" in reason
    never = exhausted_reason(6, 5, {"attempts": 0, "unfinished": 0, "last_failure": ""})
    assert "never scored" in never and "died each time" not in never
    stopped = exhausted_reason(6, 5, {"attempts": 0, "unfinished": 0, "last_failure": "", "handbacks": 6})
    assert "6 attempt(s) were handed back unfinished by workers that were stopping" in stopped
    assert "died" not in stopped and "never scored" not in stopped
