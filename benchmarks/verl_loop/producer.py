"""``python -m benchmarks.verl_loop.producer``: the producer's CPU per trajectory, against live workers.

What a rollout process pays to have one trajectory scored: GSM8K trajectories of
:mod:`benchmarks.verl_loop.trajectories` (1-8 outputs, mean 4.5; ids from the real 128k tokenizer,
as Python lists, as verl's agent loop has them) pushed ``--concurrency`` at a time to
``rewardq worker`` processes on a throwaway ``redis-server`` of the benchmark's own, through

* **client**: ``AsyncRewardClient.put_trajectory_and_wait`` with the dataset row as the sample;
* **adapter**: ``VerlScorer.score(outputs, kwargs)``, what ``RewardqAgentLoopWorker._compute_score``
  runs (the sample columns, the put and the wait, the failure budget, the results written onto the
  outputs).

The figure is this process's CPU (every thread, user and kernel: ``getrusage``) from the first put to
the last result, divided by the trajectories; the part of it spent in the garbage collector is printed
beside it (``gc.callbacks``): the collections walk the round's id lists, built just before each round,
and a full one that lands in a round is much of the spread between rounds. The workers' CPU over the
same span is printed beside it, from ``/proc``, split into their event-loop threads, their other threads
(the decode thread) and their scorer processes, and the benchmark's ``redis-server``'s (every thread; it
serves the workers too, so it is the whole pipeline's Redis CPU per trajectory). Every reward is checked
against the trajectory's known answer (GSM8K: 1.0 right, 0.0 wrong). verl's ``AgentLoopOutput`` is used
when verl is installed, else a stand-in with the same attributes.

    python -m benchmarks.verl_loop.producer --trajectories 400 --repeat 4
    python -m benchmarks.verl_loop.producer --profile prof.txt   # cProfile of the measured rounds
    python -m benchmarks.verl_loop.producer --worker-profile /tmp/w  # the workers' event loops, cProfile

To compare two versions of rewardq in one run, run this file from each tree in turn
(``PYTHONPATH=<tree> python <this file> ...``), alternating; the workers are started from the
interpreter's own rewardq.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.procfs import process_tree, thread_cpu
from benchmarks.verl_loop.local_workers import start_redis, start_workers, workers_up
from benchmarks.verl_loop.tokenizer import shipped_files
from benchmarks.verl_loop.trajectories import Trajectories, Trajectory

#: The workers' CPU, as :func:`process_tree_cpu` splits it, then the redis-server's (:func:`fleet_cpu`).
WORKER_PARTS = ("event loop", "other threads", "scorer processes")
SERVER_PART = "redis-server"


class CollectorTime:
    """The process CPU seconds the garbage collector took while :attr:`on` (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.on = False
        self.seconds = 0.0
        self._start = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._start = time.process_time()
        else:
            self.seconds += time.process_time() - self._start


class Metrics:
    compute_score: float = 0.0


class StandInOutput:
    """verl's ``AgentLoopOutput`` attributes the adapter reads and writes (verl not installed)."""

    def __init__(self, **fields: Any) -> None:
        self.response_logprobs = None
        self.multi_modal_data = None
        self.reward_score = None
        self.metrics = Metrics()
        self.__dict__.update(fields)


def outputs_of(t: Trajectory) -> list[Any]:
    try:
        return t.verl_outputs()
    except ImportError:
        pass
    return [StandInOutput(**t.output_fields(k)) for k in range(t.n)]


def process_tree_cpu(pid: int) -> tuple[float, float, float]:
    """CPU seconds of ``pid``'s event-loop thread (its main thread), of its other threads (the decode
    thread, ...), and of its live descendants (scorer processes), from ``/proc``."""
    threads = thread_cpu(pid)
    main_thread = threads.pop(pid, 0.0)
    descendants = sum(sum(thread_cpu(p).values()) for p in process_tree(pid) if p != pid)
    return main_thread, sum(threads.values()), descendants


def fleet_cpu(fleet: Fleet) -> tuple[float, float, float, float]:
    """:func:`process_tree_cpu` summed over the fleet's workers, then the redis-server's CPU seconds."""
    parts = [process_tree_cpu(w.pid) for w in fleet.workers]
    server = sum(thread_cpu(fleet.redis.pid).values())
    return sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts), server


class Fleet:
    """A throwaway redis-server and ``rewardq worker`` processes (naive manager, the real tokenizer)."""

    def __init__(self, workers: int, profile: str = "") -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="rqb-producer-"))
        self.profile = Path(profile).resolve() if profile else None
        self.redis, self.url = start_redis(self.tmp, "2gb")
        self.namespace = f"rqp-{uuid.uuid4().hex[:6]}"
        self.count = workers
        self.workers: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        import redis

        names = [f"w{i}" for i in range(self.count)]
        self.workers = start_workers(
            self.url, self.namespace, names, str(shipped_files()[0]), self.tmp, profile=self.profile
        )
        r = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 180
        while not workers_up(r, self.namespace, names, self.workers, self.tmp, deadline):
            time.sleep(0.1)
        r.close()

    def stop(self) -> None:
        for w in self.workers:
            w.terminate()
        for w in self.workers:
            w.wait(30)
        self.redis.terminate()
        self.redis.wait(10)
        shutil.rmtree(self.tmp, ignore_errors=True)  # the workers' logs and the server's folder


async def rounds(a: argparse.Namespace, fleet: Fleet) -> dict[str, list[float]]:
    from rewardq.adapter_settings import AdapterSettings
    from rewardq.integrations.verl.scoring import VerlScorer, sample_columns, trajectory_names
    from rewardq.producers.aio import AsyncRewardClient

    trajs = Trajectories("gsm8k", 0).range(0, a.trajectories)
    expected = [1.0 if t.right else 0.0 for t in trajs]
    client = AsyncRewardClient.from_url(fleet.url, namespace=fleet.namespace)
    scorer = VerlScorer(AdapterSettings(redis_url=fleet.url, namespace=fleet.namespace, timeout=600))
    gate = asyncio.Semaphore(a.concurrency)

    async def by_client(t: Trajectory, outs: list[Any], kw: dict[str, Any]) -> float:
        uid, sid = trajectory_names(kw)
        async with gate:
            keys, results = await client.put_trajectory_and_wait(uid, sid, outs, sample_columns(kw), timeout=600)
        return float(results[keys[-1]].reward_score or 0.0)

    async def by_adapter(t: Trajectory, outs: list[Any], kw: dict[str, Any]) -> float:
        async with gate:
            await scorer.score(outs, kw)
        return float(outs[-1].reward_score)

    paths = {"client": by_client, "adapter": by_adapter}
    got: dict[str, list[float]] = {p: [] for p in a.paths.split(",")}
    names = list(got)
    profile = cProfile.Profile() if a.profile else None
    collector = CollectorTime()
    for r in range(-1, a.repeat):  # round -1 warms up connections, scripts and caches
        for name in names if r % 2 else reversed(names):
            items = [(t, outputs_of(t), t.kwargs()) for t in trajs]
            if profile is not None and r >= 0:
                profile.enable()
            collected = collector.seconds
            collector.on = True
            c = resource.getrusage(resource.RUSAGE_SELF)
            wc = fleet_cpu(fleet)
            rewards = await asyncio.gather(*(paths[name](t, o, kw) for t, o, kw in items))
            e = resource.getrusage(resource.RUSAGE_SELF)
            collector.on = False
            we = fleet_cpu(fleet)
            used = (e.ru_utime + e.ru_stime) - (c.ru_utime + c.ru_stime)
            system = e.ru_stime - c.ru_stime
            if profile is not None:
                profile.disable()
            wrong = sum(1 for x, y in zip(rewards, expected) if x != y)
            if wrong:
                raise SystemExit(f"{name}: {wrong} of {len(trajs)} rewards differ from the reference")
            if r >= 0:
                got[name].append(1000 * used / len(trajs))
                got.setdefault(f"{name} (kernel)", []).append(1000 * system / len(trajs))
                gc_ms = 1000 * (collector.seconds - collected) / len(trajs)
                got.setdefault(f"{name} (garbage collector)", []).append(gc_ms)
                for part, before, after in zip(WORKER_PARTS, wc, we):
                    got.setdefault(f"workers' {part} ({name})", []).append(1000 * (after - before) / len(trajs))
                got.setdefault(f"{SERVER_PART} ({name})", []).append(1000 * (we[3] - wc[3]) / len(trajs))
    await client.aclose()
    await scorer.aclose()
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(a.sort).print_stats(60)
        Path(a.profile).write_text(out.getvalue())
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trajectories", type=int, default=400)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--paths", default="client,adapter", help="which of client,adapter")
    p.add_argument("--profile", default="", help="write a cProfile of the measured rounds here")
    p.add_argument("--sort", default="tottime", help="the cProfile order (tottime, cumulative)")
    p.add_argument(
        "--worker-profile", default="", help="run the workers under cProfile, dumped to FILE.<name> when they stop"
    )
    a = p.parse_args()
    import rewardq

    fleet = Fleet(a.workers, a.worker_profile)
    try:
        fleet.start()
        load = os.getloadavg()[0]
        got = asyncio.run(rounds(a, fleet))
    finally:
        fleet.stop()
    print(f"rewardq from {Path(rewardq.__file__).parent}; load {load:.1f} -> {os.getloadavg()[0]:.1f}")
    for name, values in got.items():
        what = "worker" if name.startswith("workers'") else "redis" if name.startswith(SERVER_PART) else "producer"
        print(
            f"{what} CPU ms/traj, {name:8s} median {statistics.median(values):.3f} "
            f"({', '.join(f'{v:.3f}' for v in values)}); {a.trajectories} trajectories x {a.repeat}, "
            f"every reward equal to the reference"
        )


if __name__ == "__main__":
    main()
