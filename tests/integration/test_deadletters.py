"""Dead letters: listed, shown, retried (and then scored), purged — against the real Redis."""

from __future__ import annotations

import asyncio

from rewardq import RewardClient
from rewardq.ops.deadletters.commands import describe_retry
from rewardq.ops.deadletters.stream import DeadLetters
from rewardq.queue.keys import Keyspace
from tests.support.helpers import SAMPLE, FlakyJudge, fail_a_trajectory_and_a_junk_entry, output, running_workers
from tests.support.managers import LengthManager
from tests.support.sync_client import connect


async def test_failed_trajectory_is_retried_after_the_fix(ns: str, redis_url: str) -> None:
    r = connect(redis_url)
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    keys, first = await fail_a_trajectory_and_a_junk_entry(ns, redis_url, r, client, "junk")
    assert all(x.status == "error" and "503" in (x.error or "") for x in first.values())
    dls = DeadLetters(r, ks)
    listed = list(dls.iter())
    assert {d.kind for d in listed} == {"scoring", "invalid"} and dls.count() == 2
    scoring = next(d for d in listed if d.kind == "scoring")
    shown = dls.get(scoring.ref).summary()
    assert shown["tid"] == "flaky_s" and "RuntimeError: judge endpoint returned 503" in shown["traceback"]
    assert shown["record"] == {"uid": "flaky", "session_id": "s", "index": 2}
    # the operator fixes the judge and retries
    FlakyJudge.broken = False
    assert "reopened flaky_s (3 results cleared); 3 kept record(s) restored" in describe_retry(dls.retry(scoring))
    assert client.get_rewards(keys) == {k: None for k in keys}
    async with running_workers(ns, redis_url, [FlakyJudge(None)]):
        second = await asyncio.to_thread(client.wait_rewards, keys, 10)
    assert [x.reward_score for x in second.values()] == [0.5, 0.5, 0.5]
    assert [d.kind for d in dls.iter()] == ["invalid"]
    assert dls.purge(kind="invalid") == 1 and dls.count() == 0
    client.close()
    r.close()


async def test_incomplete_trajectory_retry_waits_again_and_completes(ns: str, redis_url: str) -> None:
    r = connect(redis_url)
    client = RewardClient.from_url(redis_url, namespace=ns)
    ks = Keyspace(ns)
    client.put_output("late", "s", 1, output(2, 6), SAMPLE, final=True)
    async with running_workers(ns, redis_url, [LengthManager(None)], incomplete_timeout=0.5, keep_records=600):
        res = await asyncio.to_thread(client.wait_rewards, ["late_s_0", "late_s_1"], 10)
    assert "missing output indices 0 of 0..1" in (res["late_s_1"].error or "")
    dls = DeadLetters(r, ks, incomplete_timeout=30)
    (d,) = list(dls.iter(kind="incomplete"))
    assert "reopened late_s (2 results cleared); 1 kept record(s) restored" in describe_retry(dls.retry(d))
    assert r.zscore(ks.waiting(0), "late_s") is not None
    client.put_output("late", "s", 0, output(2, 2), SAMPLE)  # the missing output finally arrives
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        res = await asyncio.to_thread(client.wait_rewards, ["late_s_0", "late_s_1"], 10)
    assert [x.reward_score for x in res.values()] == [6.0, 6.0]
    client.close()
    r.close()


async def test_dead_letters_are_bounded_in_bytes_keep_a_prefix_and_keep_their_count_right(
    ns: str, redis_url: str
) -> None:
    from rewardq.consumers.failures import FailureHandler
    from rewardq.consumers.metrics import NoMetrics
    from rewardq.queue.broker import StreamBroker
    from rewardq.queue.connection import connect_async
    from rewardq.queue.entries import Entry
    from rewardq.queue.states import DeadLetterKind

    r = connect(redis_url)
    ks = Keyspace(ns)
    client = connect_async(redis_url)
    # Given a worker whose dead-letter streams keep at most 300 kB, for an hour
    broker = StreamBroker(client, ks, worker="w", dead_letter_bytes=300_000, dead_letter_ttl=3600)
    failures = FailureHandler(
        broker, worker_name="w", max_record_bytes=32 << 20, stats={"dead_letters": 0, "errors": 0}, metrics=NoMetrics()
    )
    try:
        await broker.ensure_groups()
        # When 12 entries naming no trajectory are dead-lettered: 10 of 50 kB, then 2 of 3 MB
        for i in range(12):
            data = bytes([i]) * (50_000 if i < 10 else 3_000_000)
            entry_id = await client.xadd(ks.stream(0), {"key": "junk", "data": data})
            await failures.dead_letter(
                Entry(0, entry_id.decode(), {b"key": b"junk", b"data": data}), DeadLetterKind.INVALID, "junk"
            )
        dead = r.xrange(ks.dead(0))
        size = sum(len(k) + len(v) for _, f in dead for k, v in f.items())
        counted = int(r.hget(ks.dead_bytes(0), "n") or 0)
        # Then the oldest went first: what is left is under the bound, and counted exactly
        assert size <= 300_000 and counted == size, (size, counted)
        assert [f[b"data"][:1] for _, f in dead][-2:] == [bytes([10]), bytes([11])]
        # And a 3 MB record keeps its first 64 KiB, saying how large it was
        last = dead[-1][1]
        assert len(last[b"data"]) == 64 * 1024 and last[b"data_bytes"] == b"3000000" and last[b"truncated"] == b"1"
        assert 0 < r.pttl(ks.dead(0)) <= 3_600_000 and 0 < r.pttl(ks.dead_bytes(0)) <= 3_600_000
        # And retrying it cannot put the record back, and says so; the count follows the deletion
        dls = DeadLetters(r, ks)
        newest = dls.get(f"0:{dead[-1][0].decode()}")
        assert newest.summary()["truncated"] is True and newest.summary()["data_bytes"] == 3_000_000
        done = dls.retry(newest)
        assert (
            not done.requeued and "not re-queued" in describe_retry(done) and "3,000,000-byte" in describe_retry(done)
        )
        assert r.xlen(ks.stream(0)) == 0
        assert int(r.hget(ks.dead_bytes(0), "n") or 0) == size - sum(len(k) + len(v) for k, v in last.items())
        assert dls.purge() == len(dead) - 1 and int(r.hget(ks.dead_bytes(0), "n") or 0) == 0
    finally:
        await client.aclose()
        r.close()
