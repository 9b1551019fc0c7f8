"""Reading a trajectory's results from its hash's copy (``result_rows``, ``result:<row>:<field>``)."""

from __future__ import annotations

from rewardq.producers.reading import keys_by_trajectory, parse_trajectory
from rewardq.queue.results import RESULT_FIELDS, RewardResult


def row(result: RewardResult, r: int) -> dict[bytes, bytes]:
    return {f"result:{r}:{f}".encode(): v for f, v in zip(RESULT_FIELDS, result.row())}


def result(key: str, score: float) -> RewardResult:
    return RewardResult(key, "ok", score, {"acc": score}, worker="w", manager="m", scored_at=1.5, latency_ms=2.0)


def test_one_shared_row_answers_every_key() -> None:
    keys = ["u_s_0", "u_s_1", "u_s_2"]
    h = {b"state": b"done", b"n": b"3", b"result_rows": b"1", **row(result("u_s_0", 0.5), 0)}
    got, missing = parse_trajectory(keys, h)
    assert missing == [] and got == {k: result(k, 0.5) for k in keys}


def test_a_row_per_key_answers_each_key_with_its_own() -> None:
    keys = ["u_s_0", "u_s_1"]
    h = {b"state": b"done", b"n": b"2", b"result_rows": b"2", **row(result("x", 0.0), 0), **row(result("x", 1.0), 1)}
    got, missing = parse_trajectory(keys, h)
    assert missing == [] and got == {"u_s_0": result("u_s_0", 0.0), "u_s_1": result("u_s_1", 1.0)}


def test_a_trajectory_still_collecting_has_no_results_and_needs_no_other_read() -> None:
    assert parse_trajectory(["u_s_0"], {b"state": b"collecting"}) == ({"u_s_0": None}, [])


def test_without_the_copy_the_keys_are_read_from_their_own_hashes() -> None:
    keys = ["u_s_0", "u_s_1"]
    assert parse_trajectory(keys, {}) == ({}, keys)  # gone, or never stored
    assert parse_trajectory(keys, {b"state": b"done", b"status": b"error"}) == ({}, keys)  # fail / expire
    # a copy with fewer rows than keys answers the ones it has
    got, missing = parse_trajectory(keys, {b"n": b"2", b"result_rows": b"2", **row(result("x", 1.0), 0)})
    assert got == {"u_s_0": result("u_s_0", 1.0)} and missing == ["u_s_1"]


def test_a_key_past_the_trajectorys_outputs_is_read_from_its_own_hash() -> None:
    # an output that arrived after its 1-output trajectory finished has its own (error) result:
    # the shared row, which answers outputs 0..n-1, must not answer it with the trajectory's reward
    h = {b"state": b"done", b"n": b"1", b"result_rows": b"1", **row(result("u_s_0", 1.0), 0)}
    got, missing = parse_trajectory(["u_s_0", "u_s_1", "u_s_7"], h)
    assert got == {"u_s_0": result("u_s_0", 1.0)} and missing == ["u_s_1", "u_s_7"]
    # and a copy without n (from before it was kept) answers nothing: every key reads its own hash
    assert parse_trajectory(["u_s_0"], {b"result_rows": b"1", **row(result("u_s_0", 1.0), 0)}) == ({}, ["u_s_0"])


def test_keys_are_grouped_by_trajectory_in_order() -> None:
    assert keys_by_trajectory(["a_s_1", "b_s_0", "a_s_0"]) == {"a_s": ["a_s_1", "a_s_0"], "b_s": ["b_s_0"]}
