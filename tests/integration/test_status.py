"""Operator views: pipeline status (incl. a deliberately stuck trajectory) and inspect."""

from __future__ import annotations

import asyncio

from rewardq import RewardClient
from rewardq.ops.inspect import inspect_trajectory
from rewardq.ops.overview import pipeline_status
from rewardq.queue.keys import Keyspace
from tests.support.helpers import SAMPLE, output, running_workers
from tests.support.managers import LengthManager
from tests.support.sync_client import connect


async def test_status_lists_stuck_trajectory_workers_and_activity(ns: str, redis_url: str) -> None:
    r = connect(redis_url)
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    client.put_output("stuck", "s", 0, output(2, 2), SAMPLE)
    client.put_output("stuck", "s", 3, output(2, 2), SAMPLE, final=True)
    client.put_output("nofinal", "s", 0, output(2, 2), SAMPLE)
    keys = client.put_trajectory("fine", "s", [output(2, 3)], SAMPLE)
    r.xadd(ks.stream(0), {"key": "junk", "data": b"junk"})
    async with running_workers(ns, redis_url, [LengthManager(None)], keep_records=60):
        await asyncio.to_thread(client.wait_rewards, keys, 10)
        await asyncio.sleep(0.5)
        st = await asyncio.to_thread(pipeline_status, r, ks)
    assert st["shards"][0]["group"] and st["shards"][0]["pending"] == 0 and st["shards"][0]["lag"] == 0
    assert [w["name"] for w in st["workers"]] == ["w0"] and st["workers"][0]["scored"] >= 1
    assert st["dead_letters"] == 1 and st["dead_letters_by_kind"] == {"invalid": 1}
    stuck = {w["tid"]: w for w in st["waiting"]}
    assert stuck["stuck_s"]["missing"] == [1, 2] and stuck["stuck_s"]["have"] == [0, 3]
    assert stuck["stuck_s"]["waiting_for"] == "outputs 1,2"
    assert stuck["nofinal_s"]["waiting_for"] == "the final output"
    assert st["waiting_total"] == 2
    assert st["recent"]["trajectories"] == 1 and st["recent"]["latency_ms_p50"] is not None
    # inspect a scored key (records kept) and a stuck trajectory
    one = inspect_trajectory(r, ks, "fine_s_0")
    assert one["state"] == "done" and one["outputs"][0]["result"]["reward_score"] == 3.0
    assert one["outputs"][0]["record"]["response_tokens"] == 3 and one["records_kept"]
    traj = inspect_trajectory(r, ks, "stuck_s")
    assert traj["state"] == "collecting" and traj["missing"] == [1, 2]
    assert [o["index"] for o in traj["outputs"]] == [0, 1, 2, 3]
    assert "record" in traj["outputs"][0] and "record" not in traj["outputs"][1]
    client.close()
    r.close()
