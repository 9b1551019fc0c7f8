"""Token ids and masks given as Python lists (what verl's agent loop hands over) are packed in C;
the record is byte for byte what the numpy path gives, and every bad list is refused as before."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rewardq.errors import RecordError
from rewardq.producers.core import prepare_trajectory
from rewardq.queue.checks import CheckedDict, check_dict
from rewardq.queue.codec import decode_output, encode_output
from rewardq.queue.keys import Keyspace
from rewardq.queue.token_arrays import as_id_array

SAMPLE: dict[str, Any] = {
    "data_source": "openai/gsm8k",
    "reward_model": {"ground_truth": "1"},
    "extra_info": {"i": np.int64(3)},
}


def output(rng: np.random.Generator, n: int = 3000) -> dict[str, Any]:
    return {
        "prompt_ids": rng.integers(0, 129_000, 500).tolist(),
        "response_ids": rng.integers(0, 129_000, n).tolist(),
        "response_mask": (rng.random(n) < 0.8).astype(int).tolist(),
        "num_turns": 2,
    }


def as_arrays(out: dict[str, Any]) -> dict[str, Any]:
    return {
        **out,
        "prompt_ids": np.asarray(out["prompt_ids"], dtype=np.int64),
        "response_ids": np.asarray(out["response_ids"], dtype=np.int64),
        "response_mask": np.asarray(out["response_mask"], dtype=np.uint8),
    }


def test_lists_encode_to_the_bytes_arrays_give() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 17, 3000):
        out = output(rng, n)
        from_lists = encode_output("u", "s", 0, out, SAMPLE, final=True)
        assert from_lists == encode_output("u", "s", 0, as_arrays(out), SAMPLE, final=True)
        rec = decode_output(from_lists)
        assert rec.response_ids.tolist() == out["response_ids"]
        assert rec.response_mask is not None and rec.response_mask.tolist() == out["response_mask"]
    assert as_id_array([], "x").shape == (0,)
    assert as_id_array([2**31 - 1, 0], "x").tolist() == [2**31 - 1, 0]


@pytest.mark.parametrize(
    "ids, reason",
    [
        ([1, -2, 3], "token id -2 is negative"),
        ([1, 2**31], "out of range"),
        ([1, 2**32], "out of range"),
        ([1, 2**70], "expected integer token ids"),
        ([1.0, 2.0], "expected integer token ids"),
        ([True, False], "expected integer token ids"),
        ([1, "2"], "cannot be read|expected integer"),
        ([[1, 2], [3, 4]], "1-D"),
    ],
)
def test_bad_id_lists_are_refused_naming_the_field(ids: Any, reason: str) -> None:
    with pytest.raises(RecordError, match=reason) as err:
        encode_output("u", "s", 0, {"prompt_ids": [1], "response_ids": ids}, None, final=True)
    assert err.value.field == "response_ids"


@pytest.mark.parametrize(
    "mask, reason",
    [
        ([1, 2, 0], "only 0"),
        ([1, -1, 0], "holds -1"),
        ([1, 1], "has 2 entries but response_ids has 3"),
        ([1, 300, 0], "only 0"),
        ([1.0, 0.0, 1.0], "integer"),
    ],
)
def test_bad_mask_lists_are_refused(mask: list[float] | list[int], reason: str) -> None:
    with pytest.raises(RecordError, match=reason) as err:
        out: dict[str, Any] = {"prompt_ids": [1], "response_ids": [1, 2, 3], "response_mask": mask}
        encode_output("u", "s", 0, out, None, final=True)
    assert err.value.field == "response_mask"


def test_a_trajectorys_sample_is_checked_once_and_still_refused_when_bad() -> None:
    rng = np.random.default_rng(1)
    ks = Keyspace("ns")
    puts = prepare_trajectory(ks, "u", "s", [output(rng, 5), output(rng, 7)], SAMPLE, max_bytes=1 << 20)
    assert [decode_output(p.fields["data"]).sample for p in puts] == [{**SAMPLE, "extra_info": {"i": 3}}] * 2
    with pytest.raises(RecordError, match="keys must be strings") as err:
        prepare_trajectory(ks, "u", "s", [output(rng, 5)], {1: "x"}, max_bytes=1 << 20)
    assert err.value.field == "sample"
    checked = check_dict(SAMPLE, "sample")
    assert type(checked) is dict and checked == SAMPLE  # callers still get a plain copy
    marked = CheckedDict(checked)
    assert check_dict(marked, "sample") is marked


def test_a_record_over_max_record_bytes_names_its_key_its_size_and_the_setting() -> None:
    # Given a trajectory whose second output alone is over the limit
    small = {"prompt_ids": [1], "response_ids": [2]}
    big = {"prompt_ids": [1], "response_ids": list(range(2000))}
    # When it is put, the error says which output it is: the key, not only "<record>"
    with pytest.raises(RecordError) as err:
        prepare_trajectory(Keyspace("ns"), "u", "s", [small, big, small], None, max_bytes=4096)
    msg = str(err.value)
    assert "u_s_1" in msg and "max_record_bytes=4096" in msg, msg
    assert f"{len(encode_output('u', 's', 1, big, None, final=False, max_bytes=1 << 20))} bytes" in msg, msg
    assert err.value.field == "<record>"
