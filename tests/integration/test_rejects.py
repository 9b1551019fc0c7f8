"""Bad input gets a clear error and loses nothing: producer-side and worker-side rejections."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from tensordict import TensorDict

from rewardq import RecordError, RewardClient
from rewardq.ledger.read import read_table
from rewardq.queue.codec import encode_output
from rewardq.queue.digests import legacy_record_digest
from rewardq.queue.keys import Keyspace
from rewardq.reward.base import RewardManager
from tests.support.helpers import LEDGER_STOP_GRACE, SAMPLE, open_test_worker, output, running_workers
from tests.support.managers import LengthManager
from tests.support.sync_client import SyncClient

GOOD = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5]}


@pytest.mark.parametrize(
    "uid,sid,index,out,field",
    [
        ("u", "s", 0, {"response_ids": [1]}, "prompt_ids"),
        ("u", "s", 0, {"prompt_ids": "abc", "response_ids": [1]}, "prompt_ids"),
        ("u", "s", 0, {"prompt_ids": [1.5, 2.0], "response_ids": [1]}, "prompt_ids"),
        ("u", "s", 0, {"prompt_ids": [1, -3], "response_ids": [1]}, "prompt_ids"),
        ("u", "s", 0, {"prompt_ids": [1], "response_ids": [2**31]}, "response_ids"),
        ("u", "s", 0, {"prompt_ids": [[1, 2]], "response_ids": [1]}, "prompt_ids"),
        ("u", "s", 0, {"prompt_ids": [1], "response_ids": [1, 2], "response_mask": [1]}, "response_mask"),
        ("u", "s", 0, {"prompt_ids": [1], "response_ids": [1, 2], "response_mask": [1, 5]}, "response_mask"),
        ("u", "s", 0, {"prompt_ids": [1], "response_ids": [1], "response_logprobs": [0.1, 0.2]}, "response_logprobs"),
        ("u", "s", 0, {"prompt_ids": [1], "response_ids": [1], "num_turns": -1}, "num_turns"),
        ("u", "s", 0, {"prompt_ids": [1], "response_ids": [1], "extra_fields": [1]}, "extra_fields"),
        ("u", "s", 0, {"prompt_ids": [1], "response_ids": [1], "reward_score": "high"}, "reward_score"),
        ("u", "s", -1, GOOD, "index"),
        ("u", "s", 1.0, GOOD, "index"),
        ("", "s", 0, GOOD, "uid"),
        ("u", None, 0, GOOD, "session_id"),
        ("u\n", "s", 0, GOOD, "uid"),
    ],
)
def test_producer_rejects_naming_the_field(
    uid: str, sid: str | None, index: float, out: dict[str, Any], field: str
) -> None:
    with pytest.raises(RecordError) as info:
        encode_output(uid, sid, index, out, SAMPLE, final=True)
    assert info.value.field == field
    assert str(info.value).startswith(field)


def test_producer_rejects_oversize_and_unserialisable_sample() -> None:
    with pytest.raises(RecordError, match="max_record_bytes"):
        encode_output("u", "s", 0, {"prompt_ids": np.arange(5000), "response_ids": [1]}, {}, final=True, max_bytes=1000)
    with pytest.raises(RecordError, match="sample"):
        encode_output("u", "s", 0, GOOD, {"x": object()}, final=True)
    with pytest.raises(RecordError, match="sample"):
        encode_output("u", "s", 0, GOOD, {1: "int key"}, final=True)  # type: ignore[dict-item]  # the wrong key is the test


def test_client_rejects_before_sending(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    with pytest.raises(RecordError, match="outputs"):
        client.put_trajectory("u", "s", [], SAMPLE)
    with pytest.raises(RecordError, match="response_ids"):
        client.put_trajectory("u", "s", [GOOD, {"prompt_ids": [1]}], SAMPLE)
    assert sync_redis.xlen(Keyspace(ns).stream(0)) == 0  # nothing half-sent
    client.close()


def _raw(uid: str = "u", **override: Any) -> bytes:
    rec = msgpack.unpackb(
        encode_output(uid, "s", 0, GOOD, SAMPLE, final=True), raw=False, ext_hook=lambda c, b: msgpack.ExtType(c, b)
    )
    rec.update(override)
    packed: bytes = msgpack.packb(rec, use_bin_type=True)
    return packed


BAD_ENTRIES = [
    ("garbage", b"\xc1\xff not msgpack", "not a valid msgpack record", None),
    ("wrong-shape", msgpack.packb([1, 2, 3]), "expected a msgpack map", None),
    ("missing-field", None, "prompt_ids: is missing", "bad1_s_0"),
    ("wrong-type", None, "response_ids: must be a packed integer array", "bad2_s_0"),
    ("version", None, "unknown schema version 99", "bad3_s_0"),
    ("negative-index", None, "index: must be >= 0", None),
    ("extra-field", None, "unknown field", "bad5_s_0"),
    ("list-ids", None, "prompt_ids: must be a packed integer array", "bad6_s_0"),
]


def _bad_payload(name: str) -> bytes:
    if name == "missing-field":
        d = msgpack.unpackb(_raw("bad1"), raw=False, ext_hook=lambda c, b: msgpack.ExtType(c, b))
        del d["prompt_ids"]
        packed: bytes = msgpack.packb(d, use_bin_type=True)
        return packed
    makers: dict[str, Callable[[], bytes]] = {
        "wrong-type": lambda: _raw("bad2", response_ids="hello"),
        "version": lambda: _raw("bad3", v=99),
        "negative-index": lambda: _raw("bad4", index=-2),
        "extra-field": lambda: _raw("bad5", surprise=1),
        "list-ids": lambda: _raw("bad6", prompt_ids=[1, 2, 3]),
    }
    return makers[name]()


async def test_worker_dead_letters_bad_entries_and_scores_the_rest(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    good_keys = client.put_trajectory("good", "s", [output(3, 5), output(4, 6)], SAMPLE)
    for name, payload, _, _ in BAD_ENTRIES:
        data = payload if payload is not None else _bad_payload(name)
        sync_redis.xadd(ks.stream(0), {"key": f"entry-{name}", "data": data, "ts": "0"})
    more_keys = client.put_trajectory("good2", "s", [output(3, 7)], SAMPLE)
    async with running_workers(ns, redis_url, [LengthManager(None)]) as (w,):
        res = await asyncio.to_thread(client.wait_rewards, good_keys + more_keys, 10)
        bad_keys = [k for *_, k in BAD_ENTRIES if k]
        bad = await asyncio.to_thread(client.wait_rewards, bad_keys, 10)
        for _ in range(50):
            if w.stats["dead_letters"] >= len(BAD_ENTRIES):
                break
            await asyncio.sleep(0.1)
    assert [r.reward_score for r in res.values()] == [6.0, 6.0, 7.0]
    for _k, r in bad.items():
        assert r.status == "error" and r.reward_score is None and r.error
        assert r.reward_extra_info == {"error": r.error}
    dead = sync_redis.xrange(ks.dead(0))
    assert len(dead) == len(BAD_ENTRIES)
    by_key = {f[b"key"].decode(): f for _, f in dead}
    for name, payload, reason, _ in BAD_ENTRIES:
        f = by_key[f"entry-{name}"]
        assert reason in f[b"reason"].decode(), (name, f[b"reason"])
        assert f[b"kind"] == b"invalid"
        assert f[b"data"] == (payload if payload is not None else _bad_payload(name))  # raw entry kept
        assert f[b"worker"] == b"w0" and int(f[b"deliveries"]) == 1
    assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0
    client.close()


async def test_an_entry_naming_another_key_than_its_record_is_answered_under_the_entry_key(
    ns: str, redis_url: str, sync_redis: SyncClient, tmp_path: Path
) -> None:
    # Given hostG's trajectory open (its output 0 stored, its final not yet put)
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = client.keyspace
    mine = output(3, 5, seed=1)
    client.put_output("hostG", "s1", 0, mine, SAMPLE)
    # And an entry routed as hostF_s1_0 (its producer waits on that key) whose record says hostG_s1_0
    claimed = encode_output("hostG", "s1", 0, mine, SAMPLE, final=True)
    sync_redis.xadd(ks.stream(ks.shard_of("hostF_s1")), {"key": "hostF_s1_0", "data": claimed, "ts": "0"})
    ledger = tmp_path / "ledger"
    async with running_workers(
        ns, redis_url, [LengthManager(None)], ledger=str(ledger), shutdown_grace=LEDGER_STOP_GRACE
    ):
        # When a worker reads them
        # Then the key the entry named gets the error result, naming both keys
        (bad,) = (await asyncio.to_thread(client.wait_rewards, ["hostF_s1_0"], 30)).values()
        assert bad.status == "error" and "'hostF_s1_0'" in (bad.error or "") and "'hostG_s1_0'" in (bad.error or "")
        # And hostG's trajectory is untouched: no result yet, and scored as usual once its final output comes
        assert client.get_rewards(["hostG_s1_0"]) == {"hostG_s1_0": None}
        client.put_output("hostG", "s1", 1, output(3, 4, seed=2), SAMPLE, final=True)
        good = await asyncio.to_thread(client.wait_rewards, ["hostG_s1_0", "hostG_s1_1"], 30)
    assert [r.status for r in good.values()] == ["ok", "ok"] and good["hostG_s1_1"].reward_score == 4.0
    # And the dead letter says both keys, filed under the entry's trajectory
    ((_, dead),) = [d for shard in range(ks.shards) for d in sync_redis.xrange(ks.dead(shard))]
    assert (dead[b"key"], dead[b"tid"], dead[b"kind"]) == (b"hostF_s1_0", b"hostF_s1", b"invalid")
    assert b"'hostF_s1_0'" in dead[b"reason"] and b"'hostG_s1_0'" in dead[b"reason"]
    # And the ledger has an error row for hostF_s1_0 only, hostG's rows being its scored ones
    rows = {r["key"]: r["status"] for r in read_table(str(ledger), columns=["key", "status"]).to_pylist()}
    assert rows == {"hostF_s1_0": "error", "hostG_s1_0": "ok", "hostG_s1_1": "ok"}
    client.close()


async def test_vocab_range_and_worker_size_limit(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    class Tok:
        vocab_size = 100

        def decode(self, ids: object, skip_special_tokens: bool = True) -> str:
            return ""

    from tests.support.helpers import worker_config

    client = RewardClient.from_url(redis_url, namespace=ns)
    k_big = client.put_trajectory("big", "s", [{"prompt_ids": [1], "response_ids": [150]}], SAMPLE)
    k_huge = client.put_trajectory("huge", "s", [{"prompt_ids": list(range(90)) * 50, "response_ids": [1]}], SAMPLE)
    k_ok = client.put_trajectory("ok", "s", [{"prompt_ids": [1], "response_ids": [99, 98]}], SAMPLE)
    w = await open_test_worker(
        worker_config(ns, redis_url, max_record_bytes=10_000),
        manager=LengthManager(None),
        tokenizer=Tok(),  # only what the worker reads
    )
    task = asyncio.create_task(w.run())
    try:
        res = await asyncio.to_thread(client.wait_rewards, k_big + k_huge + k_ok, 10)
    finally:
        w.request_stop()
        await task
    assert "out of range for a vocabulary of 100" in (res[k_big[0]].error or "")
    assert "exceeds max_record_bytes=10000" in (res[k_huge[0]].error or "")
    assert res[k_ok[0]].reward_score == 2.0
    client.close()


async def test_conflicting_records_fail_the_trajectory_with_reasons(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    # same key, different content
    client.put_output("dup", "s", 0, output(3, 3, seed=1), SAMPLE)
    client.put_output("dup", "s", 0, output(3, 3, seed=2), SAMPLE)
    # two finals
    client.put_output("fin", "s", 0, output(3, 3), SAMPLE, final=True)
    client.put_output("fin", "s", 1, output(3, 3), SAMPLE, final=True)
    # index beyond final
    client.put_output("beyond", "s", 1, output(3, 3), SAMPLE, final=True)
    client.put_output("beyond", "s", 3, output(3, 3), SAMPLE)
    # an identical duplicate is not a conflict
    client.put_trajectory("same", "s", [output(3, 3, seed=5), output(3, 4, seed=6)], SAMPLE)
    client.put_output("same", "s", 0, output(3, 3, seed=5), SAMPLE)
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        res = await asyncio.to_thread(
            client.wait_rewards,
            ["dup_s_0", "fin_s_0", "fin_s_1", "beyond_s_0", "beyond_s_1", "beyond_s_3", "same_s_0", "same_s_1"],
            10,
        )
    assert "two different records for key dup_s_0" in (res["dup_s_0"].error or "")
    assert "two outputs marked final: 0 and 1" in (res["fin_s_0"].error or "")
    assert res["fin_s_1"].status == "error"
    assert "index beyond the final output 1" in (res["beyond_s_3"].error or "")
    assert res["beyond_s_0"].status == "error" and res["beyond_s_1"].status == "error"
    assert res["same_s_0"].reward_score == 4.0 and res["same_s_1"].reward_score == 4.0
    kinds = [f[b"kind"] for _, f in sync_redis.xrange(ks.dead(0))]
    assert kinds == [b"conflict"] * 3
    client.close()


async def test_records_filed_by_an_earlier_version_are_still_told_from_conflicts(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    """Given trajectories whose first output a worker of an earlier version filed (its digest
    BLAKE2b's, rewardq/queue/digests.py), when the same output arrives again for one and a
    different one for the other, then the first is scored and the second fails as a conflict."""
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    for uid in ("same", "other"):
        client.put_output(uid, "s", 0, output(3, 3, seed=1), SAMPLE)
    keys = {uid: ks.traj_key(f"{uid}_s") for uid in ("same", "other")}
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        for _ in range(200):
            if all(sync_redis.hexists(k, "o:0") for k in keys.values()):
                break
            await asyncio.sleep(0.05)
    for k in keys.values():  # as an earlier version filed it
        digest = sync_redis.hget(k, "h:0")
        assert digest is not None and digest.startswith(b"x")
        sync_redis.hset(k, "h:0", legacy_record_digest(sync_redis.hget(k, "o:0")))
    client.put_output("same", "s", 0, output(3, 3, seed=1), SAMPLE)
    client.put_output("other", "s", 0, output(3, 3, seed=2), SAMPLE)
    for uid in ("same", "other"):
        client.put_output(uid, "s", 1, output(3, 4, seed=3), SAMPLE, final=True)
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        res = await asyncio.to_thread(client.wait_rewards, ["same_s_0", "same_s_1", "other_s_0"], 10)
    assert res["same_s_0"].reward_score == 4.0 and res["same_s_1"].reward_score == 4.0
    assert "two different records for key other_s_0" in (res["other_s_0"].error or "")
    assert [f[b"kind"] for _, f in sync_redis.xrange(ks.dead(0))] == [b"conflict"]
    client.close()


class _Bad(RewardManager):
    def __init__(self, mode: str) -> None:
        super().__init__(None)
        self.mode = mode

    async def run_single(self, data: TensorDict) -> dict[str, Any] | list[dict[str, Any]]:
        uid = data[-1]["extra_info"]["mode"]
        if uid == "raise":
            raise ValueError("judge exploded")
        if uid == "nan":
            return {"reward_score": math.nan, "reward_extra_info": {}}
        if uid == "string":
            return {"reward_score": "great", "reward_extra_info": {}}
        if uid == "hang":
            await asyncio.sleep(3600)
        if uid == "wrong-count":
            return [{"reward_score": 1.0}] * 5
        return {"reward_score": 1.0, "reward_extra_info": {"fine": True}}


async def test_failing_scorers_give_error_results_and_dead_letters(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    modes = ["raise", "nan", "string", "hang", "wrong-count", "fine"]
    keys = {
        m: client.put_trajectory(m, "s", [output(2, 2), output(2, 3)], {**SAMPLE, "extra_info": {"mode": m}})
        for m in modes
    }
    async with running_workers(ns, redis_url, [_Bad("x")], score_timeout=1.0):
        res = await asyncio.to_thread(client.wait_rewards, [k for ks_ in keys.values() for k in ks_], 15)
    err = {m: res[keys[m][0]].error for m in modes}
    assert "ValueError: judge exploded" in (err["raise"] or "")
    assert "nan" in (err["nan"] or "") and "finite" in (err["nan"] or "")
    assert "must be a number, got str" in (err["string"] or "")
    assert "timed out after 1s" in (err["hang"] or "")
    assert "returned 5 results for a trajectory of 2 outputs" in (err["wrong-count"] or "")
    assert err["fine"] is None and res[keys["fine"][1]].reward_score == 1.0
    for m in modes[:-1]:
        assert res[keys[m][1]].error == err[m]  # every key of the trajectory gets the error
    dead = {f[b"tid"].decode(): f for _, f in sync_redis.xrange(ks.dead(0))}
    assert set(dead) == {f"{m}_s" for m in modes[:-1]}
    assert b"ValueError: judge exploded" in dead["raise_s"][b"traceback"]
    assert dead["raise_s"][b"kind"] == b"scoring"
    client.close()
