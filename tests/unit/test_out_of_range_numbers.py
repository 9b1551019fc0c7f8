"""A number no record can carry is a RecordError naming its field, never a bare OverflowError."""

from __future__ import annotations

from typing import Any

import pytest

from rewardq.errors import RecordError
from rewardq.queue.codec import encode_output


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"reward_score": 10**400}, "reward_score"),
        ({"reward_score": -(10**400)}, "reward_score"),
        ({"reward_score": float("nan")}, "reward_score"),
        ({"num_turns": 10**400}, "num_turns"),
        ({"num_turns": 2**63}, "num_turns"),
    ],
)
def test_an_out_of_range_number_is_a_record_error_naming_its_field(fields: dict[str, Any], name: str) -> None:
    output = {"prompt_ids": [1, 2], "response_ids": [3], **fields}
    with pytest.raises(RecordError) as err:
        encode_output("u", "s", 0, output, {}, final=True, max_bytes=10**6)
    assert err.value.field == name and len(str(err.value)) < 300


def test_an_out_of_range_number_in_the_sample_is_a_record_error() -> None:
    with pytest.raises(RecordError, match="msgpack cannot carry"):
        encode_output(
            "u", "s", 0, {"prompt_ids": [1], "response_ids": [2]}, {"x": 10**400}, final=True, max_bytes=10**6
        )
