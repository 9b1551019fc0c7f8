"""One system of the comparison, in a process of its own: ``python -m benchmarks.verl_loop.side PLAN.json``.

The orchestrator (:mod:`benchmarks.verl_loop.__main__`) writes the plan (system, size, scorers
and their sizes, the tokenizer folder, where the references are) and reads back the result
JSON. Running each system alone in its own process keeps the CPU accounting clean: the
producer group is exactly this process.

* ``verl``: ``ray.init(address="local")`` (never another cluster), verl's own ``RewardLoopManager``
  on verl's generated trainer config (``reward.num_workers`` = size, the naive manager; for
  math-verify the custom reward function), and a verl ``AgentLoopWorker`` whose
  ``_compute_score`` sends each trajectory to a random one of its ``RewardLoopWorker`` actors.
  Groups: scorers (the ``RewardLoopWorker`` processes and what they started), Ray (every other
  process Ray started: GCS, raylet, idle workers), producer (this process, Ray's driver threads
  included).
* ``rewardq``: a throwaway ``redis-server`` of its own (its CPU is the broker's, no other
  client's), ``size`` ``rewardq worker`` processes (naive manager, the same tokenizer folder;
  for math-verify ``--reward-fn``), and ``RewardqAgentLoopWorker._compute_score``. Groups:
  scorers (the worker processes and their scorer processes and sandboxes), Redis, producer.

``pin`` in the plan (``--pinned``) lays the two sides out as a cluster does (rollout on the GPU
nodes, rewards on CPU nodes): every process the reward side starts (Ray's GCS, raylet and
``RewardLoopWorker`` actors; rewardq's Redis, workers and their scorer processes) inherits the
reward core(s), because this process starts them with its threads on those cores; then every
thread of this process (the producer: verl's agent-loop driver with Ray's driver threads, or our
adapter) moves to the producer core(s). Each result says which cores each group's processes ran on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.procfs import cmdline, stat_cpu
from benchmarks.procfs import process_tree as tree
from benchmarks.ray_start import init_local_ray
from benchmarks.verl_loop import drive
from benchmarks.verl_loop.local_workers import start_redis, start_workers, workers_up
from benchmarks.verl_loop.procs import group_cpu
from benchmarks.verl_loop.reference import References
from benchmarks.verl_loop.trajectories import Trajectories

HERE = Path(__file__).resolve().parent
MATH_VERIFY_FN = HERE / "math_verify_fn.py"


def _producer_cpu() -> float:
    return stat_cpu(os.getpid())[0]


def pin_threads(cpus: list[int] | None) -> None:
    """Put every thread of this process on ``cpus`` (``os.sched_setaffinity(0)`` moves only the
    calling thread; processes started afterwards inherit the mask of the thread that starts them)."""
    if not cpus:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), set(cpus))
        except OSError:
            pass  # a thread that just ended


def cores_of(pids: list[int]) -> list[int]:
    """The cores the processes ``pids`` may run on, all together."""
    seen: set[int] = set()
    for pid in pids:
        try:
            seen |= os.sched_getaffinity(pid)
        except OSError:
            pass
    return sorted(seen)


# ----------------------------------------------------------------------------------------------
# verl
# ----------------------------------------------------------------------------------------------


class VerlSide:
    """verl's reward loop: Ray, ``RewardLoopManager``, ``AgentLoopWorker._compute_score``."""

    name = "verl"

    def __init__(self, plan: dict[str, Any]) -> None:
        import ray

        self.plan = plan
        self.ray = ray
        self.tmp = init_local_ray(
            "rqb-ray-",
            plan.get("workdir"),
            include_dashboard=False,
            num_cpus=os.cpu_count() or 2,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
        self.handles: list[Any] = []

    def config(self, scorer: str) -> Any:
        import verl
        from omegaconf import OmegaConf

        cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
        cfg.actor_rollout_ref.model.path = self.plan["tokenizer"]
        cfg.reward.num_workers = self.plan["size"]
        cfg.reward.reward_manager.name = "naive"
        if scorer == "math_verify":
            cfg.reward.custom_reward_function.path = str(MATH_VERIFY_FN)
            cfg.reward.custom_reward_function.name = "compute_score"
        return cfg

    async def start(self, scorer: str) -> Any:
        from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
        from verl.experimental.reward_loop.reward_loop import RewardLoopManager

        manager = RewardLoopManager(self.config(scorer), rm_resource_pool=None)
        self.handles = list(manager.reward_loop_worker_handles)
        await asyncio.gather(*(h.__ray_ready__.remote() for h in self.handles))
        worker = object.__new__(AgentLoopWorker)  # verl's class; only what _compute_score reads is set
        worker.reward_loop_worker_handles = self.handles
        worker.processor = None
        worker.mm_processor_kwargs = None
        return worker._compute_score

    def reward_pids(self) -> list[int]:
        me = os.getpid()
        return [p for p in tree(me) if p != me]

    def cpu(self) -> dict[str, float]:
        me = os.getpid()
        scorers = [p for p in tree(me) if p != me and "RewardLoopWorker" in cmdline(p)]
        everything = group_cpu([me])
        actor_cpu = group_cpu(scorers)
        producer = _producer_cpu()
        return {"scorers": actor_cpu, "broker": everything - actor_cpu - producer, "producer": producer}

    async def stop_scorer(self) -> None:
        for h in self.handles:
            self.ray.kill(h)
        self.handles = []
        await asyncio.sleep(1.0)

    async def close(self) -> None:
        self.ray.shutdown()


# ----------------------------------------------------------------------------------------------
# rewardq
# ----------------------------------------------------------------------------------------------


class RewardqSide:
    """rewardq: its own Redis, ``rewardq worker`` processes, ``RewardqAgentLoopWorker._compute_score``."""

    name = "rewardq"

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.tmp = Path(tempfile.mkdtemp(prefix="rqb-redis-", dir=plan.get("workdir")))
        self.redis, self.url = start_redis(self.tmp, "4gb")
        self.workers: list[subprocess.Popen[bytes]] = []
        self.adapter: Any = None

    async def start(self, scorer: str) -> Any:
        import redis

        from rewardq.integrations.verl import RewardqAgentLoopWorker

        ns = f"rqb-{scorer}-{uuid.uuid4().hex[:6]}"
        extra = ["--reward-fn", f"{MATH_VERIFY_FN}:compute_score"] if scorer == "math_verify" else []
        names = [f"w{i}-{uuid.uuid4().hex[:4]}" for i in range(self.plan["size"])]
        self.workers = start_workers(self.url, ns, names, self.plan["tokenizer"], self.tmp, extra)
        r = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 180
        while not workers_up(r, ns, names, self.workers, self.tmp, deadline):
            await asyncio.sleep(0.1)
        r.close()
        os.environ.update(REWARDQ_REDIS_URL=self.url, REWARDQ_NAMESPACE=ns, REWARDQ_VERL_TIMEOUT="900")
        self.adapter = object.__new__(RewardqAgentLoopWorker)  # as verl builds it, minus the rollout parts
        return self.adapter._compute_score

    def reward_pids(self) -> list[int]:
        return [p for root in [self.redis.pid, *(w.pid for w in self.workers)] for p in tree(root)]

    def cpu(self) -> dict[str, float]:
        return {
            "scorers": group_cpu([w.pid for w in self.workers]),
            "broker": group_cpu([self.redis.pid]),
            "producer": _producer_cpu(),
        }

    async def stop_scorer(self) -> None:
        if self.adapter is not None:
            await self.adapter.rewardq_scorer().aclose()
        for w in self.workers:
            w.terminate()
        for w in self.workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        self.workers = []

    async def close(self) -> None:
        await self.stop_scorer()
        self.redis.terminate()
        self.redis.wait(10)


# ----------------------------------------------------------------------------------------------


async def run(plan: dict[str, Any]) -> list[dict[str, Any]]:
    pin = plan.get("pin") or {}
    pin_threads(pin.get("reward"))  # what the side starts now inherits the reward cores
    side: Any = VerlSide(plan) if plan["system"] == "verl" else RewardqSide(plan)
    pin_threads(pin.get("producer"))
    results = []
    try:
        for sc in plan["scorers"]:
            name = sc["name"]
            refs = References.from_json(json.loads(Path(plan["refs"][name]).read_text()))
            trajs = Trajectories(name, plan["seed"])
            b, s, w = sc["burst"], sc["steady"], sc["warm"]
            pin_threads(pin.get("reward"))
            score = await side.start(name)
            pin_threads(pin.get("producer"))
            cores = {"producer": cores_of([os.getpid()]), "reward": cores_of(side.reward_pids())}
            try:
                # warm-up: first-call costs (imports, pools, connections) are no phase's
                await asyncio.gather(*(score(t.verl_outputs(), kwargs=t.kwargs()) for t in trajs.range(b + s, w)))
                for rnd in range(sc["rounds"]):
                    res = await drive.burst(score, trajs.range(0, b), refs, side.cpu)
                    results.append({**res, "round": rnd + 1, "scorer": name, "cores": cores})
                    _say(plan, results[-1])
                if s:
                    res = await drive.steady(
                        score, trajs.range(b, s), refs, side.cpu, rate=sc["rate"], warmup=sc["steady_warmup"]
                    )
                    results.append({**res, "round": 1, "scorer": name, "cores": cores})
                    _say(plan, results[-1])
            finally:
                await side.stop_scorer()
    finally:
        await side.close()
    for r in results:
        r.update(system=plan["system"], size=plan["size"])
    return results


def _say(plan: dict[str, Any], r: dict[str, Any]) -> None:
    what = f"wall {r['wall_s']:.1f}s" + (f" p50 {r['p50_ms']:.0f} p99 {r['p99_ms']:.0f} ms" if "p50_ms" in r else "")
    print(
        f"  {plan['system']} x{plan['size']} {r['scorer']} {r['phase']} r{r['round']}: {what}; "
        f"cpu {', '.join(f'{k} {v:.1f}s' for k, v in r['cpu_s'].items())}; {r['check']}; load {r['load']}; "
        f"cores {r['cores']}",
        file=sys.stderr,
        flush=True,
    )


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    results = asyncio.run(run(plan))
    Path(plan["out"]).write_text(json.dumps(results, indent=1))
    sys.stdout.flush()
    os._exit(0)  # skip torch's and Ray's interpreter teardown: everything was stopped above


if __name__ == "__main__":
    main()
