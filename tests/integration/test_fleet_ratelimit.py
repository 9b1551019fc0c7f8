"""The `limited` manager's limits hold for the whole fleet: two real `rewardq worker`
processes share one max_rpm budget (per-process limiters would allow twice as much)."""

from __future__ import annotations

from rewardq import RewardClient
from tests.support.cli_procs import wait_for
from tests.support.helpers import SAMPLE, output

RPM = 120  # bucket of 120 requests, refilled at 2/s
N = RPM + 24  # the burst, then 24 requests that must wait for the refill: >= 12 s together


def test_two_worker_processes_share_one_request_budget(procs, redis_url, ns, sync_redis):
    # Given two worker processes running `limited` with max_rpm=120, both alive before any work arrives
    def args(name):
        return [
            "worker",
            "--redis-url",
            redis_url,
            "--namespace",
            ns,
            "--manager",
            "limited",
            "--tokenizer",
            "builtin:demo",
            "--name",
            name,
            "--manager-option",
            f"max_rpm={RPM}",
            "--manager-option",
            "max_concurrent=16",
            "--concurrency",
            "16",
            "--batch-size",
            "8",
            "--log-level",
            "WARNING",
        ]

    workers = [procs.start(args(f"lim{i}"), tag=f"lim{i}") for i in range(2)]
    wait_for(
        lambda: all(sync_redis.exists(f"{ns}:worker:lim{i}") for i in range(2)), 90, "both heartbeats", procs=workers
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
    # ... and the combined rate after the burst is the configured one, not twice it
    times = sorted(r.scored_at for r in res.values())
    after_burst = times[-1] - times[RPM - 1]
    assert after_burst >= (N - RPM) / (RPM / 60) * 0.8, (after_burst, by_worker)  # >= ~9.6 s for 24 at 2/s
    # token-bucket bound: at most the bucket plus what refilled while they ran (per-process
    # limiters would let all N through at once)
    assert N <= RPM + (times[-1] - times[0]) * RPM / 60 + 1
    client.close()
    for w in workers:
        assert w.terminate() == 0, w.stderr()[-2000:]
