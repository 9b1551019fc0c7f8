"""What isolating a sync reward function costs: ``python -m benchmarks.isolation``.

Two measurements, each with the same cheap scorer (:func:`gsm8k_reward`, GSM8K strict:
a regex over the last 300 characters, ~10 µs), run inline, in threads and in scorer
processes (:mod:`rewardq.reward.execution.isolation`):

1. **per call**: ``ScoreFnRouter.call`` alone, one call at a time (latency) and 32 in
   flight (throughput). CPU is the benchmark process's plus the scorer processes'.
2. **end to end**: one in-process worker (``naive`` manager, the benchmark's GSM8K
   workload: 1-8 outputs of 1,000-4,000 tokens, decoded before scoring) drains a backlog of
   ``--trajectories`` pushed beforehand to the Redis at ``--url``; trajectories per second
   and CPU per trajectory (worker + scorer processes). Its keys carry ``rqbench-iso-<id>``
   and are deleted at the end.

    python -m benchmarks.isolation [--calls 5000] [--trajectories 2000] [--url redis://...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from typing import Any

from benchmarks.common import Cleanup
from benchmarks.procfs import cpu_seconds
from rewardq.reward.execution.isolation import ScoreFnRouter
from rewardq.reward.execution.settings import ScoringSettings
from rewardq.reward.scoring import gsm8k

PLACEMENTS = ("inline", "thread", "process")
TEXT = "Natalia sold 48 clips in April and half as many in May. 48 + 24 = 72.\n#### 72"
#: A decoded response of ~3,000 tokens, as the end-to-end workload has.
LONG_TEXT = "The clips add up, one step at a time. " * 320 + TEXT


def gsm8k_reward(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The cheap scorer: GSM8K strict, as a user's ``--reward-fn`` would call it."""
    return gsm8k.compute_score(solution_str, ground_truth)


def _scorer_pids(router: ScoreFnRouter) -> list[int]:
    pids: list[int] = []
    for _, place in router._places.values():
        pool = getattr(place, "pool", None)
        if pool is not None:
            pids += [p for p in pool.pids if p is not None]
    return pids


def _cpu(router: ScoreFnRouter) -> float:
    return time.process_time() + sum(cpu_seconds(p) for p in _scorer_pids(router))


async def per_call(placement: str, calls: int, text: str = TEXT) -> dict[str, float]:
    from benchmarks.isolation import gsm8k_reward  # by its module's name (not __main__): processes load it so

    router = ScoreFnRouter(ScoringSettings(reward_fn_placement=placement, processes=2))
    kwargs = {"data_source": "openai/gsm8k", "solution_str": text, "ground_truth": "72", "extra_info": {}}
    await router.prepare(gsm8k_reward)
    for _ in range(200):  # warm-up
        await router.call(gsm8k_reward, kwargs)
    out = {}
    try:
        c0, t0 = _cpu(router), time.perf_counter()
        for _ in range(calls):
            await router.call(gsm8k_reward, kwargs)
        out["sequential_us"] = (time.perf_counter() - t0) / calls * 1e6
        out["sequential_cpu_us"] = (_cpu(router) - c0) / calls * 1e6

        async def lane(n: int) -> None:
            for _ in range(n):
                await router.call(gsm8k_reward, kwargs)

        c0, t0 = _cpu(router), time.perf_counter()
        await asyncio.gather(*(lane(calls // 32) for _ in range(32)))
        done = calls // 32 * 32
        out["concurrent_us"] = (time.perf_counter() - t0) / done * 1e6
        out["concurrent_cpu_us"] = (_cpu(router) - c0) / done * 1e6
    finally:
        await router.close()
    return out


async def end_to_end(placement: str, url: str, n: int) -> dict[str, float]:
    from benchmarks.workload import Workload
    from rewardq import RewardClient
    from rewardq.config import WorkerConfig
    from rewardq.consumers.compose import open_worker, prepare_worker

    ns = f"rqbench-iso-{uuid.uuid4().hex[:8]}"
    client = RewardClient.from_url(url, namespace=ns)
    work = Workload(seed=7, tag=f"{placement[0]}")
    keys: list[str] = []
    try:
        for i in range(n):
            t = work[i]
            keys += client.put_trajectory(t.uid, t.session_id, t.outputs(), t.sample())
        cfg = WorkerConfig(
            redis_url=url,
            namespace=ns,
            name=f"iso-{placement}",
            reward_fn=f"{os.path.abspath(__file__)}:gsm8k_reward",
            reward_fn_placement=placement,
            scorer_processes=2,
            tokenizer="builtin:demo",  # the workload's ids are the demo tokenizer's
        ).validate()
        worker = await open_worker(prepare_worker(cfg))
        assert worker is not None
        router = worker.manager.host.router
        c0, t0 = _cpu(router), time.perf_counter()
        task = asyncio.create_task(worker.serve())
        while worker.stats["scored"] + worker.stats["errors"] < n:
            await asyncio.sleep(0.02)
        took, cpu = time.perf_counter() - t0, _cpu(router) - c0
        worker.request_stop("benchmark done")
        await task
        await worker.stop()
        results = client.get_rewards(keys[-1:])
        assert all(r is not None and r.status == "ok" for r in results.values()), results
        return {"per_s": n / took, "cpu_ms": cpu / n * 1000, "errors": float(worker.stats["errors"])}
    finally:
        client.close()
        Cleanup(url).run([f"{ns}:*"])


async def main(args: argparse.Namespace) -> None:
    print(f"per call ({args.calls} calls; cheap scorer: GSM8K strict)")
    print(f"{'placement':<22}{'seq us':>10}{'seq cpu us':>12}{'32x us':>10}{'32x cpu us':>12}")
    for placement, text in [*((p, TEXT) for p in PLACEMENTS), ("process", LONG_TEXT)]:
        m = await per_call(placement, args.calls, text)
        label = placement + (f" ({len(text) // 1000} KB text)" if text is LONG_TEXT else "")
        print(
            f"{label:<22}{m['sequential_us']:>10.1f}{m['sequential_cpu_us']:>12.1f}"
            f"{m['concurrent_us']:>10.1f}{m['concurrent_cpu_us']:>12.1f}"
        )
    if args.trajectories:
        print(f"\nend to end ({args.trajectories} trajectories, one worker, naive manager, --reward-fn)")
        print(f"{'placement':<10}{'traj/s':>10}{'cpu ms/traj':>13}")
        for placement in PLACEMENTS:
            m = await end_to_end(placement, args.url, args.trajectories)
            print(f"{placement:<10}{m['per_s']:>10.1f}{m['cpu_ms']:>13.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m benchmarks.isolation", description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--trajectories", type=int, default=2000, help="0: skip the end-to-end part")
    p.add_argument("--url", default=os.environ.get("REWARDQ_BENCH_URL", "redis://127.0.0.1:6379/0"))
    asyncio.run(main(p.parse_args()))
