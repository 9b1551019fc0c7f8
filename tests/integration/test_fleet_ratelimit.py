"""The `rate_limited` manager's limits hold for the whole fleet, with verl's token buckets: two
real `rewardq worker` processes share one max_rpm budget whose bucket holds one second of the
rate (per-process limiters would allow twice as much; minute-sized buckets would let every
request out at once)."""

from __future__ import annotations

from rewardq import RewardClient
from tests.support.cli_procs import START_WAIT, Procs, wait_for, worker_argv
from tests.support.helpers import SAMPLE, output
from tests.support.sync_client import SyncClient

RPM = 120  # a bucket of 2 requests, refilled at 2/s
N = 24  # 2 at once, then 22 at 2/s: ~11 s together


def test_two_worker_processes_share_one_request_budget(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    # Given two worker processes running `rate_limited` with max_rpm=120, both alive before any work arrives
    def args(name: str) -> list[str]:
        return worker_argv(
            redis_url,
            ns,
            name,
            "--manager-option",
            f"max_rpm={RPM}",
            "--manager-option",
            "max_concurrent=16",
            # few in flight per worker, so both workers take part (one could read all 24 at once)
            "--concurrency",
            "3",
            "--batch-size",
            "1",
            "--log-level",
            "WARNING",
            manager="rate_limited",
        )

    workers = [procs.start(args(f"lim{i}"), tag=f"lim{i}") for i in range(2)]
    wait_for(
        lambda: all(sync_redis.exists(f"{ns}:worker:lim{i}") for i in range(2)),
        START_WAIT,
        "both heartbeats",
        procs=workers,
    )
    # When more trajectories than the bucket holds arrive at once
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = [
        client.put_trajectory(f"j{t}", "s", [output(3, 3)], {**SAMPLE, "data_source": "openai/gsm8k"})[0]
        for t in range(N)
    ]
    res = client.wait_rewards(keys, timeout=120)
    # Then every request was scored, by both workers, ...
    assert all(r.status == "ok" for r in res.values())
    by_worker = {w: sum(r.worker == w for r in res.values()) for w in ("lim0", "lim1")}
    assert min(by_worker.values()) > 0, by_worker
    # ... and together they took at least 10 s: the fleet sent 2 requests/s, not 120 at once
    # (the measurement before: all 24 went out in 1.4 s)
    times = sorted(r.scored_at for r in res.values())
    spread = times[-1] - times[0]
    assert spread >= 10.0, (spread, by_worker)
    print(f"24 requests at {RPM} rpm across two workers: {spread:.2f} s from first to last, by worker {by_worker}")
    # never more than the bucket plus the refill over any prefix of the run
    for i, t in enumerate(times):
        assert i + 1 <= 2 + (t - times[0]) * RPM / 60 + 1, (i, t - times[0])
    client.close()
    for w in workers:
        assert w.terminate() == 0, w.stderr()[-2000:]
