"""Bounded trajectories at the worker, and records that end with their trajectory: real Redis.

* A trajectory past ``max_trajectory_bytes`` (read whole, or arriving output by output past the
  producer's check) gets an error result on every key naming the limit; Redis never holds more of
  it than the limit; every entry is acknowledged.
* A trajectory whose padded batch would pass ``max_batch_bytes`` is refused before the batch is built.
* The stored records (``o:<i>``) of a trajectory that ended, scored or failed (scoring error, bad
  record, never completed), are deleted once its result is written; with ``keep_records`` they are
  kept in ``records:<tid>`` for that long only.
* Keys count bytes at both ends; a record giving ``uid`` twice or a mask of 2 is refused whole.

Records here are a few MB at most; the throwaway server is used where a missing bound would fill it.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import msgpack
import numpy as np
import pytest

from rewardq import RewardClient
from rewardq.consumers.worker import Worker
from rewardq.queue.codec import encode_output
from rewardq.queue.keys import Keyspace
from tests.support.checks import must
from tests.support.helpers import SAMPLE, FlakyJudge, output, running_workers, until
from tests.support.hostile import raw_record
from tests.support.managers import LengthManager
from tests.support.redis_server import RedisServer
from tests.support.sync_client import SyncClient

MiB = 1024 * 1024
MAXMEMORY = ["--maxmemory", "2gb", "--maxmemory-policy", "noeviction"]
LIMITS: dict[str, Any] = dict(max_record_bytes=4 * MiB, max_trajectory_bytes=10 * MiB)


def _read_past(w: Worker, n: int) -> bool:
    """``w`` has read more than ``n`` entries."""
    return bool(w.stats["read"] >= n + 1)


def _big(i: int, mb: float = 3.0) -> dict[str, Any]:
    return {"prompt_ids": np.full(int(mb * MiB / 4), 7, dtype=np.int32) + i, "response_ids": [1, 2]}


def _record_fields(r: Any, key: str) -> list[bytes]:
    return [f for f in r.hkeys(key) if f.startswith(b"o:")]


@pytest.mark.parametrize("arrival", ["whole", "one-by-one"])
async def test_a_trajectory_past_max_trajectory_bytes_is_answered_with_an_error_on_every_key(arrival: str) -> None:
    with RedisServer(extra=MAXMEMORY) as srv:
        ns, ks = "tb", Keyspace("tb")
        r = srv.client()
        client = RewardClient.from_url(srv.url, namespace=ns, max_record_bytes=4 * MiB)
        _ = client.keyspace
        good = client.put_trajectory("good", "s", [output(3, 4), output(2, 5)], SAMPLE)
        n = 6  # 6 records of 3 MB: 18 MB, past the 10 MB the workers allow
        datas = [encode_output("big", "s", i, _big(i), SAMPLE, final=i == n - 1, max_bytes=4 * MiB) for i in range(n)]
        async with running_workers(ns, srv.url, [LengthManager(None)], **LIMITS) as (w,):
            if arrival == "whole":  # as a foreign producer's MULTI would: all read in one batch
                pipe = r.pipeline(transaction=True)
                for i, d in enumerate(datas):
                    pipe.xadd(ks.stream(0), {"key": f"big_s_{i}", "data": d})
                pipe.execute()
            else:  # output by output, each stored before the next arrives
                for i, d in enumerate(datas):
                    r.xadd(ks.stream(0), {"key": f"big_s_{i}", "data": d})
                    await until(functools.partial(_read_past, w, 2 + i), f"output {i} to be read", 30)
            keys = [f"big_s_{i}" for i in range(n)]
            got = await asyncio.to_thread(client.wait_rewards, keys, 60)
            ok = await asyncio.to_thread(client.wait_rewards, good, 30)
            await until(lambda: r.xpending(ks.stream(0), ks.group)["pending"] == 0, "every entry acked", 30)
        # Then every key has an error naming the limit
        assert {x.status for x in got.values()} == {"error"}
        assert all("max_trajectory_bytes=10" in (x.error or "") for x in got.values()), got[keys[0]].error
        # And the records are gone: none in the trajectory hash, none in the stream
        assert _record_fields(r, ks.traj(0, "big_s")) == [] and r.xlen(ks.stream(0)) == 0
        assert not r.exists(ks.records(0, "big_s"))
        # And the good trajectory beside it is scored
        assert [x.reward_score for x in ok.values()] == [5.0, 5.0]
        client.close()
        r.close()


async def test_a_batch_padded_past_max_batch_bytes_is_refused_before_it_is_built(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    # 40 one-token outputs and one of 500k response tokens: 41 rows padded to 500k, ~82 MB of int64 batch
    outs = [output(1, 1, seed=i) for i in range(40)] + [output(1, 500_000, seed=99)]
    keys = client.put_trajectory("pad", "s", outs, SAMPLE)
    good = client.put_trajectory("fine", "s", [output(2, 3)], SAMPLE)
    LengthManager.calls = []
    async with running_workers(ns, redis_url, [LengthManager(None)], max_batch_bytes=64 * MiB):
        got = await asyncio.to_thread(client.wait_rewards, keys, 30)
        ok = await asyncio.to_thread(client.wait_rewards, good, 30)
    assert {x.status for x in got.values()} == {"error"}
    reason = got[keys[0]].error
    assert "max_batch_bytes=67,108,864" in (reason or "") and "41 outputs padded to 1 prompt and 500,000 response" in (
        reason or ""
    )
    assert [int(d.batch_size[0]) for d in LengthManager.calls] == [1]  # only the good one reached the manager
    assert ok[good[0]].status == "ok"
    assert [f[b"kind"] for _, f in sync_redis.xrange(ks.dead(0))] == [b"invalid"]
    client.close()


async def _end_four_ways(ns: str, url: str, r: Any, client: RewardClient, **settings: Any) -> dict[str, list[str]]:
    """Four trajectories of 3 stored outputs each, ending scored, failed scoring, refused (a
    conflicting record) and incomplete; returns their keys."""
    ks = Keyspace(ns)
    outs = [output(2, 3, seed=i) for i in range(3)]
    keys = {"incomplete": [client.put_output("inc", "s", i, outs[i], SAMPLE) for i in range(2)]}
    FlakyJudge.broken = True
    async with running_workers(ns, url, [FlakyJudge(None)], incomplete_timeout=1.0, **settings):
        keys["failed"] = client.put_trajectory("flaky", "s", outs, SAMPLE)
        await asyncio.to_thread(client.wait_rewards, keys["failed"], 30)
        FlakyJudge.broken = False
        keys["scored"] = client.put_trajectory("ok", "s", outs, SAMPLE)
        keys["conflict"] = [client.put_output("cf", "s", i, outs[i], SAMPLE) for i in range(2)]
        await until(lambda: r.hexists(ks.traj(0, "cf_s"), "o:1"), "the conflict trajectory's outputs stored", 30)
        r.xadd(ks.stream(0), {"key": "cf_s_1", "data": raw_record("cf", "s", 1, final=False, num_turns=9)})
        for k in keys.values():
            await asyncio.to_thread(client.wait_rewards, k, 30)
    return keys


async def test_the_records_of_every_trajectory_that_ended_are_deleted_once_its_result_is_written(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks, r = Keyspace(ns), sync_redis
    keys = await _end_four_ways(ns, redis_url, r, client)
    statuses = {how: must(client.get_rewards(k)[k[0]]).status for how, k in keys.items()}
    assert statuses == {"scored": "ok", "incomplete": "error", "failed": "error", "conflict": "error"}
    for tid in ("ok_s", "inc_s", "flaky_s", "cf_s"):
        assert _record_fields(r, ks.traj(0, tid)) == [], tid  # no o:<i> left
        assert not r.exists(ks.records(0, tid))
        assert r.hget(ks.traj(0, tid), "state") == b"done" and 0 < r.ttl(ks.traj(0, tid)) <= 7 * 86400
    assert r.xlen(ks.stream(0)) == 0
    client.close()


async def test_keep_records_keeps_them_for_that_long_only_then_retry_restores_them(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks, r = Keyspace(ns), sync_redis
    await _end_four_ways(ns, redis_url, r, client, keep_records=120)
    for tid in ("ok_s", "inc_s", "flaky_s", "cf_s"):
        kept = r.hkeys(ks.records(0, tid))
        assert kept and all(k.startswith(b"o:") for k in kept), (tid, kept)
        assert 0 < r.ttl(ks.records(0, tid)) <= 120, tid
        assert _record_fields(r, ks.traj(0, tid)) == []  # moved, not copied
    assert len(r.hkeys(ks.records(0, "ok_s"))) == 3 and len(r.hkeys(ks.records(0, "inc_s"))) == 2


async def test_a_retry_without_kept_records_says_what_to_do(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    from rewardq.ops.deadletters.commands import describe_retry
    from rewardq.ops.deadletters.stream import DeadLetters

    client = RewardClient.from_url(redis_url, namespace=ns)
    await _end_four_ways(ns, redis_url, sync_redis, client)
    dls = DeadLetters(sync_redis, Keyspace(ns))
    scoring = next(d for d in dls.iter() if d.kind == "scoring")
    said = describe_retry(dls.retry(scoring))
    assert "reopened flaky_s (3 results cleared)" in said
    assert "records were not kept" in said and "put the trajectory again" in said and "--keep-records" in said
    client.close()


# -- keys count bytes; ambiguous records; masks ------------------------------------------------------------
async def test_a_multibyte_uid_the_producer_accepts_is_scored_by_the_worker(ns: str, redis_url: str) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    uid = "abcdef" + "漢" * 83  # 255 bytes
    keys = client.put_trajectory(uid, "s", [output(2, 3), output(2, 4)], SAMPLE)
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        got = await asyncio.to_thread(client.wait_rewards, keys, 30)
    assert [(x.status, x.reward_score) for x in got.values()] == [("ok", 4.0), ("ok", 4.0)]
    client.close()


def _uid_twice(first: str, second: str) -> bytes:
    good = msgpack.unpackb(raw_record("x", "s"), raw=False, ext_hook=lambda c, b: msgpack.ExtType(c, b))
    items = [("uid", first), *((k, v) for k, v in good.items() if k != "uid"), ("uid", second)]
    packer = msgpack.Packer(use_bin_type=True)
    result: bytes = packer.pack_map_header(len(items)) + b"".join(packer.pack(k) + packer.pack(v) for k, v in items)
    return result


async def test_a_record_with_uid_twice_is_refused_and_harms_neither_trajectory_it_names(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    sync_redis.xadd(ks.stream(0), {"key": "named_s_0", "data": _uid_twice("first", "second")})
    async with running_workers(ns, redis_url, [LengthManager(None)]) as (w,):
        bad = await asyncio.to_thread(client.wait_rewards, ["named_s_0"], 30)
        # the trajectories the two uids name are untouched: each scores when it arrives
        first = client.put_trajectory("first", "s", [output(2, 3)], SAMPLE)
        second = client.put_trajectory("second", "s", [output(2, 6)], SAMPLE)
        got = await asyncio.to_thread(client.wait_rewards, first + second, 30)
    assert bad["named_s_0"].status == "error" and "a field is given twice" in (bad["named_s_0"].error or "")
    assert [(x.status, x.reward_score) for x in got.values()] == [("ok", 3.0), ("ok", 6.0)]
    assert [f[b"kind"] for _, f in sync_redis.xrange(ks.dead(0))] == [b"invalid"]
    client.close()


@pytest.mark.parametrize("value", [2, 7, -1])
async def test_a_raw_mask_the_producer_refuses_is_refused_by_the_worker(ns: str, redis_url: str, value: int) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    import redis as redis_lib

    raw = redis_lib.Redis.from_url(redis_url)
    mask = msgpack.ExtType(1, np.array([1, value], "<i4").tobytes())
    ids = msgpack.ExtType(1, np.array([5, 6], "<i4").tobytes())
    raw.xadd(ks.stream(0), {"key": "m_s_0", "data": raw_record("m", "s", response_ids=ids, response_mask=mask)})
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        got = await asyncio.to_thread(client.wait_rewards, ["m_s_0"], 30)
    assert got["m_s_0"].status == "error" and f"response_mask: holds {value}" in (got["m_s_0"].error or "")
    raw.close()
    client.close()
