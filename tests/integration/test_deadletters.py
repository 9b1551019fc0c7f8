"""Dead letters: listed, shown, retried (and then scored), purged — against the real Redis."""

from __future__ import annotations

import asyncio

from rewardq import RewardClient
from rewardq.ops.deadletters import describe_retry
from rewardq.queue.deadletters import DeadLetters
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
