"""The whole-trajectory fast path (lua/claim.lua): one script per trajectory, records left
in the stream, and every guarantee of the slow path kept."""

from __future__ import annotations

import asyncio

from rewardq import RewardClient
from rewardq.consumers.worker import Worker
from rewardq.queue.keys import Keyspace
from tests.conftest import LengthManager
from tests.helpers import SAMPLE, output, running_workers, worker_config
from tests.test_recovery import Hang, _abandon


async def test_whole_trajectory_is_claimed_without_copying_records(ns, redis_url, sync_redis):
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    client.put_trajectory("fast", "s", [output(3, 4), output(3, 5), output(3, 6)], SAMPLE)
    w = Worker(worker_config(ns, redis_url, name="A"), manager=Hang(None))
    await w.start()
    try:
        await w.handle(await w.broker.read([0], 10, None))
        h = {k.decode(): v for k, v in sync_redis.hgetall(ks.traj_key("fast_s")).items()}
        assert h["lease"] == b"A" and h["final"] == b"2" and len(h["whole"].split(b",")) == 3
        assert not [k for k in h if k.startswith("o:")]  # nothing copied into the hash
        assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 3  # pending until the commit acks
        assert sync_redis.xlen(ks.stream(0)) == 3
    finally:
        await _abandon(w)
        client.close()


async def test_late_duplicates_of_a_whole_trajectory(ns, redis_url, sync_redis):
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    same = client.put_trajectory("same", "s", [output(3, 4, seed=1), output(3, 5, seed=2)], SAMPLE)
    client.put_trajectory("diff", "s", [output(3, 4, seed=1), output(3, 5, seed=2)], SAMPLE)
    a = Worker(worker_config(ns, redis_url, name="A"), manager=Hang(None))
    await a.start()
    await a.handle(await a.broker.read([0], 10, None))  # both claimed whole by A, which then dies
    await _abandon(a)
    client.put_output("same", "s", 1, output(3, 5, seed=2), SAMPLE, final=True)  # identical: harmless
    client.put_output("diff", "s", 0, output(3, 4, seed=9), SAMPLE)  # same key, other content
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        res = await asyncio.to_thread(client.wait_rewards, same + ["diff_s_0", "diff_s_1"], 15)
    assert [res[k].reward_score for k in same] == [5.0, 5.0]
    assert "two different records for key diff_s_0" in res["diff_s_0"].error
    assert res["diff_s_1"].status == "error"
    assert sync_redis.xlen(ks.stream(0)) == 0 and sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0
    client.close()
