"""Prometheus endpoint: scraped during a run, the counters move."""

from __future__ import annotations

import asyncio
import math
import re
import urllib.request

import pytest

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from tests.support.checks import must
from tests.support.helpers import SAMPLE, open_test_worker, output, until, worker_config
from tests.support.managers import LengthManager
from tests.support.sync_client import SyncClient


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def test_metrics_endpoint_counts_a_run(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    w = await open_test_worker(
        worker_config(ns, redis_url, name="m", metrics_port=0, manager="test-length"), manager=LengthManager(None)
    )
    task = asyncio.create_task(w.run())
    try:
        await until(lambda: w.metrics_port, "the metrics endpoint")
        before = await asyncio.to_thread(_scrape, must(w.metrics_port))
        keys = []
        for t in range(20):
            keys += client.put_trajectory(f"u{t}", "s", [output(3, 2), output(3, 4)], SAMPLE)
        sync_redis.xadd(Keyspace(ns).stream(0), {"key": "junk", "data": b"\x00not msgpack"})
        await asyncio.to_thread(client.wait_rewards, keys, 10)
        for _ in range(100):
            after = await asyncio.to_thread(_scrape, must(w.metrics_port))
            # a task counts its trajectory just after its commit: wait for all 20 and the junk
            ok = after.get('rewardq_trajectories_total{manager="test-length",outcome="ok"}', 0)
            if after.get('rewardq_dead_letters_total{reason="invalid"}', 0) >= 1 and ok >= 20:
                break
            await asyncio.sleep(0.1)
    finally:
        w.request_stop()
        await task
        client.close()
    assert before.get("rewardq_records_read_total", 0) == 0
    assert after["rewardq_records_read_total"] == 41
    assert after['rewardq_trajectories_total{manager="test-length",outcome="ok"}'] == 20
    assert after['rewardq_dead_letters_total{reason="invalid"}'] == 1
    count = [v for k, v in after.items() if re.match(r'rewardq_scoring_seconds_count\{.*data_source="test"', k)]
    assert count == [20.0]
    assert "rewardq_in_flight" in after and "rewardq_reclaimed_total" in after


async def test_backlog_gauges_show_the_namespaces_backlog_and_its_drain_time(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    from tests.support.managers import EchoManager

    client = RewardClient.from_url(redis_url, namespace=ns)
    w = await open_test_worker(
        worker_config(ns, redis_url, name="slow", metrics_port=0, concurrency=1, batch_size=1),
        manager=EchoManager(sleep=0.1),
    )
    task = asyncio.create_task(w.run())
    try:
        await until(lambda: w.metrics_port, "the metrics endpoint")
        keys = []
        for t in range(40):
            keys += client.put_trajectory(f"u{t}", "s", [output(3, 2)], SAMPLE)
        seen = {}
        for _ in range(100):  # until the worker has a measured rate and entries still wait
            seen = await asyncio.to_thread(_scrape, must(w.metrics_port))
            if seen.get("rewardq_backlog_entries", 0) > 0 and 0 < seen.get("rewardq_backlog_seconds", 0) < math.inf:
                break
            await asyncio.sleep(0.1)
        rate = float(sync_redis.hget(Keyspace(ns).worker("slow"), "outputs_rate") or 0)
        await asyncio.to_thread(client.wait_rewards, keys, 60)
        for _ in range(100):
            drained = await asyncio.to_thread(_scrape, must(w.metrics_port))
            if drained["rewardq_backlog_entries"] == 0:
                break
            await asyncio.sleep(0.1)
    finally:
        w.request_stop()
        await task
        client.close()
    entries, seconds = seen["rewardq_backlog_entries"], seen["rewardq_backlog_seconds"]
    assert 0 < entries < 40 and 0 < seconds < math.inf, seen
    assert rate > 0 and seconds == pytest.approx(entries / rate, rel=0.6)  # the figures of the same minute
    assert drained["rewardq_backlog_entries"] == 0 and drained["rewardq_backlog_seconds"] == 0
