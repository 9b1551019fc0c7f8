"""A result is checked and encoded once, before its commit: what is refused, what is converted, at what cost.

Pure functions (:mod:`rewardq.queue.extra_info`, :func:`rewardq.queue.results.encode_results`,
:mod:`rewardq.queue.text`); the end-to-end cases (a commit batch a bad value cannot fail, a
10 MiB extra info on a throwaway Redis) are in ``tests/integration/test_result_limits.py``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
import torch

from rewardq.errors import ResultError
from rewardq.queue.extra_info import MAX_DEPTH, encode_extra_info
from rewardq.queue.results import RESULT_FIELDS, RewardResult, encode_results
from rewardq.queue.text import MAX_REASON_BYTES, reason_text, utf8

MiB = 1024 * 1024


def _result(key: str, extra: object, **kw: object) -> RewardResult:
    base: dict[str, Any] = dict(status="ok", reward_score=1.0, worker="w", manager="m", scored_at=1.0, latency_ms=2.0)
    base.update(kw)
    return RewardResult(key=key, reward_extra_info=extra, **base)  # type: ignore[arg-type]


def _decode(data: bytes) -> object:
    return json.loads(data.decode("utf-8"))


# -- refused, naming the path --------------------------------------------------------------------
def test_a_self_referencing_dict_is_refused_naming_the_cycle() -> None:
    d: dict[str, Any] = {"score": 1.0}
    d["self"] = d
    with pytest.raises(ResultError) as err:
        encode_extra_info(d, MiB)
    assert "reward_extra_info.self refers back to reward_extra_info" in str(err.value)
    assert "cycle" in str(err.value)


def test_a_cycle_deep_inside_names_both_ends() -> None:
    inner: list[object] = [1]
    inner.append({"back": inner})
    with pytest.raises(ResultError, match=r"reward_extra_info\.a\[1\]\.back refers back to reward_extra_info\.a,"):
        encode_extra_info({"a": inner}, MiB)


def test_the_same_dict_twice_is_no_cycle() -> None:
    shared = {"x": 1}
    assert _decode(encode_extra_info({"a": shared, "b": [shared, shared]}, MiB)) == {
        "a": {"x": 1},
        "b": [{"x": 1}, {"x": 1}],
    }


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 3000, 100_000])
def test_nesting_past_the_limit_is_refused_without_a_recursion_error(depth: Any) -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(depth):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(ResultError, match=f"nests dicts/lists deeper than {MAX_DEPTH} levels"):
        encode_extra_info(deep, MiB)


def test_nesting_up_to_the_limit_is_kept() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(MAX_DEPTH - 1):
        node["a"] = {}
        node = node["a"]
    assert encode_extra_info(deep, MiB).count(b"{") == MAX_DEPTH


@pytest.mark.parametrize(
    "extra, a, b",
    [
        ({1: "int", "1": "str"}, "1", "'1'"),
        ({True: "bool", "true": "str"}, "True", "'true'"),
        ({None: "none", "null": "str"}, "None", "'null'"),
        ({"x": {2.5: "f", "2.5": "s"}}, "2.5", "'2.5'"),
    ],
)
def test_keys_that_json_writes_as_one_are_refused(
    extra: dict[bool | str, str] | dict[int | str, str] | dict[str | None, str] | dict[str, dict[float | str, str]],
    a: str,
    b: str,
) -> None:
    with pytest.raises(ResultError) as err:
        encode_extra_info(extra, MiB)
    assert f"keys {a} and {b}" in str(err.value) and "one would silently replace the other" in str(err.value)


def test_a_hostile_str_is_named_not_raised() -> None:
    class Boom:
        def __str__(self) -> str:
            raise RuntimeError("no")

    with pytest.raises(ResultError, match=r"reward_extra_info\.x\[0\] is a Boom whose str\(\) raised RuntimeError"):
        encode_extra_info({"x": [Boom()]}, MiB)
    with pytest.raises(ResultError, match="Boom key whose str"):
        encode_extra_info({Boom(): 1}, MiB)


def test_an_integer_larger_than_any_float_is_refused_naming_its_path_and_size() -> None:
    with pytest.raises(ResultError, match=r"reward_extra_info\.n is an integer of 16,610 bits \(about 5,000 digits\)"):
        encode_extra_info({"n": 10**5000}, MiB)
    with pytest.raises(ResultError) as err:
        encode_extra_info({"acc": [1, -(10**400)]}, MiB)
    assert str(err.value).startswith(
        "reward_extra_info.acc[1] is an integer of 1,329 bits (about 400 digits), larger than any float"
    )
    with pytest.raises(ResultError, match="an integer key of 16,610 bits"):
        encode_extra_info({10**5000: 1}, MiB)
    # every integer a float can hold is kept, exactly, as an integer
    for n in (2**1023, -(10**308), 2**64 + 1):
        assert json.loads(encode_extra_info({"n": n}, MiB)) == {"n": n}


# -- converted ------------------------------------------------------------------------------------
def test_plain_values_numpy_torch_tuples_sets_and_other_keys_are_converted() -> None:
    extra = {
        "score": 0.25,
        "acc": True,
        "pred": "72",
        "np": np.float32(1.5),
        "arr": np.arange(3),
        "t": torch.tensor([1.0, 2.0]),
        "tup": (1, "a"),
        "set": {7},
        1: "int key",
        "none": None,
    }
    assert _decode(encode_extra_info(extra, MiB)) == {
        "score": 0.25,
        "acc": True,
        "pred": "72",
        "np": 1.5,
        "arr": [0, 1, 2],
        "t": [1.0, 2.0],
        "tup": [1, "a"],
        "set": [7],
        "1": "int key",
        "none": None,
    }


def test_nan_and_infinities_stay_floats_a_trainer_can_average() -> None:
    data = encode_extra_info({"a": math.nan, "b": [math.inf, -math.inf], "c": np.float64("nan"), "d": 0.5}, MiB)
    assert data == b'{"a":NaN,"b":[Infinity,-Infinity],"c":NaN,"d":0.5}'
    got = cast(dict[str, Any], _decode(data))
    assert math.isnan(got["a"]) and got["b"] == [math.inf, -math.inf] and math.isnan(got["c"])
    # a trainer averaging a column over rows meets floats, never a string
    assert math.isnan(float(np.mean([got["a"], got["d"]]))) and np.mean([got["d"], got["d"]]) == 0.5


def test_lone_surrogates_become_replacement_characters_in_valid_utf8() -> None:
    data = encode_extra_info({"pred": "ok\udc80\ud800x", "\udfff": 1}, MiB)
    data.decode("utf-8")  # valid UTF-8
    assert _decode(data) == {"pred": "ok\ufffd\ufffdx", "\ufffd": 1}


def test_non_ascii_text_is_stored_as_is() -> None:
    assert _decode(encode_extra_info({"pred": "答案 ✓"}, MiB)) == {"pred": "答案 ✓"}
    assert "答案".encode() in encode_extra_info({"pred": "答案"}, MiB)


# -- bounded in bytes -----------------------------------------------------------------------------
def test_a_10_mib_extra_info_is_refused_naming_max_result_bytes_and_the_size() -> None:
    with pytest.raises(ResultError) as err:
        encode_extra_info({"score": 0.25, "blob": "x" * (10 * MiB)}, MiB)
    text = str(err.value)
    assert "max_result_bytes=1,048,576" in text and "at least 10,485," in text


def test_a_huge_value_is_refused_before_it_is_converted() -> None:
    class Huge:
        """An array-like that must never be turned into a list."""

        def numel(self) -> int:
            return 10**12

        def tolist(self) -> list[float]:
            raise AssertionError("tolist called on a value already known to be over the limit")

    with pytest.raises(ResultError, match="max_result_bytes"):
        encode_extra_info({"a": Huge()}, MiB)
    many = list(range(10**6))
    with pytest.raises(ResultError, match="max_result_bytes"):
        encode_extra_info({"a": many}, 10_000)


def test_the_limit_is_exact_on_the_encoded_bytes() -> None:
    extra = {"pred": "é" * 100}  # 200 bytes of UTF-8 in 100 characters
    size = len(encode_extra_info(extra, MiB))
    assert len(encode_extra_info(extra, size)) == size
    with pytest.raises(ResultError, match=f"{size:,} bytes of JSON, over max_result_bytes={size - 1:,}"):
        encode_extra_info(extra, size - 1)


# -- a trajectory's results ------------------------------------------------------------------------
def test_one_result_for_every_key_is_encoded_once_and_counts_every_key_it_writes() -> None:
    extra = {"acc": 1.0}
    enc = encode_results([_result(f"t_s_{i}", extra) for i in range(300)], MiB)
    assert len(enc.rows) == 1 and enc.n == 300
    assert enc.written_bytes == 300 * enc.sizes[0]
    assert enc.sizes[0] == sum(len(f) for f in RESULT_FIELDS) + sum(len(v) for v in enc.rows[0])


def test_per_key_results_sharing_one_dict_encode_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = RewardResult.extra_info_json

    def counting(self: RewardResult, limit: int = 2**62) -> bytes:
        calls.append(self.key)
        return real(self, limit)

    monkeypatch.setattr(RewardResult, "extra_info_json", counting)
    extra = {"judge": "ok"}
    enc = encode_results([_result(f"t_s_{i}", extra, reward_score=float(i)) for i in range(5)], MiB)
    assert len(enc.rows) == 5 and calls == ["t_s_0"]


def test_a_result_over_the_limit_names_its_key_the_limit_and_the_size() -> None:
    results = [_result("t_s_0", {"a": 1}), _result("t_s_1", {"blob": "x" * 5000}, reward_score=2.0)]
    with pytest.raises(ResultError) as err:
        encode_results(results, 4096)
    text = str(err.value)
    assert "t_s_1" in text and "max_result_bytes=4,096" in text and "5,0" in text


def test_the_whole_hash_counts_toward_the_limit() -> None:
    extra = {"a": "x" * 100}
    js = encode_extra_info(extra, MiB)
    with pytest.raises(ResultError, match=r"the result of t_s_0 is \d+ bytes"):
        encode_results([_result("t_s_0", extra)], len(js) + 10)  # the extra info fits, the hash does not


def test_text_fields_never_fail_to_encode() -> None:
    r = _result("t_s_0", {}, worker="w\udc80", manager="m\ud800", status="error", error="bad \udc80 " * 1000)
    (row,) = encode_results([r], MiB).rows
    for value in row:
        value.decode("utf-8")
    assert len(row[RESULT_FIELDS.index("error")]) <= MAX_REASON_BYTES


def test_reason_text_is_bounded_valid_and_says_it_was_cut() -> None:
    text = reason_text("é" * 5000 + "\x00\x01\x1b[31m")
    assert len(text.encode()) <= MAX_REASON_BYTES and "more bytes cut" in text
    assert reason_text("a\x00b\tc\nd") == "a?b\tc\nd"
    assert utf8("\udc80") == "\ufffd".encode()


# -- cost --------------------------------------------------------------------------------------------
def test_checking_a_typical_result_costs_about_what_json_dumps_does() -> None:
    """The check replaces the plain ``json.dumps`` the commit needed anyway; it must not add more
    than a few times its cost (a ratio measured in the same run, never an absolute time)."""
    typical = {"score": 1.0, "acc": True, "pred": "72", "format": 0.1}
    n = 20_000

    def once(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0

    def plain_fn() -> object:
        return json.dumps(typical, ensure_ascii=False, separators=(",", ":")).encode()

    def checked_fn() -> object:
        return encode_extra_info(typical, MiB)

    # alternated, best of 7 each: a burst of other work on a shared machine hits both alike
    rounds = [(once(plain_fn), once(checked_fn)) for _ in range(7)]
    plain, checked = min(p for p, _ in rounds), min(c for _, c in rounds)
    print(f"\nper typical result: json.dumps {plain / n * 1e6:.2f} µs, checked {checked / n * 1e6:.2f} µs")
    assert checked < 4 * plain
