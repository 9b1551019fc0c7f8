"""``python -m benchmarks.faults``: the fault-injection run, in one command.

It starts its own ``redis-server`` (AOF, ``appendfsync always``) on a free port and
several worker processes, pushes GSM8K-style trajectories of 1-8 outputs whose rewards
are known in advance, and meanwhile:

* SIGKILLs a random worker every few seconds and starts a replacement;
* some replacements are armed to SIGKILL themselves at a precise point
  (``tests.support.proc_worker``: right after reading, between write-back and acknowledgement,
  right after the commit);
* crashes Redis once (SIGKILL) part-way through and starts it again on the same port.

Then it waits for every key and checks that each has exactly one result with the
expected reward, prints one line on stdout::

    trajectories=2000 keys=9013 kills=14 redis_restarts=1 lost=0 duplicated=0 errors=0

(progress goes to stderr) and exits non-zero if anything was lost, duplicated or
errored, or if no worker was killed (workers are killed while trajectories are pushed and until
90 % of them are done, once a replacement has finished starting). ``lost`` = keys without a
result (or whose trajectory never finished), ``duplicated`` = trajectories finished twice plus
keys whose result is not the expected one, ``errors`` = error results. Every process it starts is stopped by its PID.

Workers are the real ``python -m rewardq worker`` with the built-in ``naive`` manager and
the GSM8K scorer, wrapped by :func:`slow_gsm8k` (set through ``--reward-fn``, as an
operator would) to take a little time, so that kills land while trajectories are scored.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_DEFAULT = 300.0


async def slow_gsm8k(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    delay: float = 0.0,
    **_: Any,
) -> dict[str, Any]:
    """The GSM8K scorer after up to ``delay`` seconds; echoes the trajectory's index for the check."""
    from rewardq.reward.scoring import gsm8k

    if delay:
        await asyncio.sleep(random.uniform(0.0, delay))
    score = gsm8k.compute_score(solution_str, str(ground_truth))
    return {"score": score, "index": (extra_info or {}).get("index")}


@dataclass
class Job:
    uid: str
    outputs: list[dict[str, Any]]
    sample: dict[str, Any]
    reward: float  # what every key of the trajectory must get


def make_workload(n: int, seed: int, max_outputs: int) -> list[Job]:
    """``n`` word problems; ~60% answered right (reward 1.0), the rest wrong (0.0)."""
    from rewardq.reward.tokenizer import load_tokenizer

    tok = load_tokenizer("builtin:demo")
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        right = rng.random() < 0.6
        answer = a + b if right else a + b + rng.randint(1, 9)
        prompt = tok.encode(f"Natalia sold {a} clips in April and {b} clips in May. How many clips in all?")
        outputs = [
            {"prompt_ids": prompt, "response_ids": tok.encode(f"Step {j + 1}: I add {a} and {b}.")}
            for j in range(rng.randint(1, max_outputs) - 1)
        ]
        final = f"{a} + {b} = {answer} clips.\n#### {answer}"
        outputs.append({"prompt_ids": prompt, "response_ids": tok.encode(final)})
        sample = {
            "data_source": "openai/gsm8k",
            "reward_model": {"ground_truth": str(a + b)},
            "extra_info": {"index": i},
        }
        jobs.append(Job(f"q{i}", outputs, sample, 1.0 if right else 0.0))
    return jobs


@dataclass
class Run:
    """Counters shared by the producer thread and the chaos loop."""

    pushed: int = 0
    produced: bool = False
    producer_error: str = ""
    producer_retries: int = 0
    kills: int = 0
    self_kills: int = 0
    unexpected: list[str] = field(default_factory=list)
    restarts: int = 0


def log(msg: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def produce(url: str, ns: str, jobs: list[Job], rate: float, run: Run) -> None:
    """Push every job at about ``rate`` trajectories/s, re-sending one if Redis stayed away too long."""
    import redis

    from rewardq import RewardClient

    client = RewardClient.from_url(url, namespace=ns, max_backlog=400, backpressure_timeout=120)
    start = time.monotonic()
    try:
        for i, job in enumerate(jobs):
            for _attempt in range(30):
                try:
                    client.put_trajectory(job.uid, "s", job.outputs, job.sample)
                    break
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    run.producer_retries += 1  # re-sending identical records is harmless
                    log(f"producer: {exc}; sending {job.uid} again")
                    time.sleep(0.5)
            else:
                raise RuntimeError(f"could not push {job.uid} after 30 attempts")
            run.pushed = i + 1
            ahead = start + (i + 1) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    except BaseException as exc:  # noqa: BLE001 - the producer thread reports its end, whatever ends it
        run.producer_error = f"{type(exc).__name__}: {exc}"
        log(f"producer failed: {run.producer_error}")
    finally:
        run.produced = True
        client.close()


class Fleet:
    """The worker processes: start, kill, replace (some replacements armed with a fault)."""

    MODES = ("kill-after-read", "kill-before-commit", "kill-after-commit")

    def __init__(
        self, url: str, ns: str, log_dir: str, settings: dict[str, Any], rng: random.Random, armed_share: float
    ) -> None:
        self.url, self.ns, self.log_dir, self.settings, self.rng = url, ns, log_dir, settings, rng
        self.armed_share = armed_share
        self.slots: list[Any] = []
        self.armed: dict[int, str] = {}
        self.started = 0

    def spawn(self, allow_fault: bool = True) -> Any:
        from tests.support.proc_worker import WorkerProcess

        self.started += 1
        name = f"w{self.started}"
        if allow_fault and self.rng.random() < self.armed_share:
            fault = f"{self.rng.choice(self.MODES)}:{self.rng.randint(1, 25)}"
            w = WorkerProcess(self.url, self.ns, fault=fault, log_dir=self.log_dir, name=name, **self.settings)
            self.armed[w.pid] = fault
        else:
            w = WorkerProcess(self.url, self.ns, cli=True, log_dir=self.log_dir, name=name, **self.settings)
        return w

    def ready(self, w: Any) -> bool:
        """Whether ``w`` has finished starting (it logged so); cached once true."""
        if not getattr(w, "ready", False):
            w.ready = f"worker {w.name} started" in w.log()
        result: bool = w.ready
        return result

    def reap(self, run: Run, redis_down_until: float) -> None:
        """Replace workers that died on their own: armed ones by their fault, others unexpectedly."""
        for i, w in enumerate(self.slots):
            if w.alive():
                continue
            rc = w.proc.returncode
            fault = self.armed.pop(w.pid, None)
            if fault and rc == -9:
                run.kills += 1
                run.self_kills += 1
                log(f"{w.name} killed itself ({fault})")
            elif rc == 3 and not self.ready(w) and time.monotonic() < redis_down_until:
                # `rewardq worker` refuses to start while Redis is unreachable (exit 3); a
                # supervisor would start it again, and so do we
                log(f"{w.name} was started while Redis was down and exited 3; starting another")
            else:
                run.unexpected.append(f"{w.name} exited {rc}")
                log(f"{w.name} exited unexpectedly with {rc}:\n{w.log()[-2000:]}")
            self.slots[i] = self.spawn()

    def kill_one(self, run: Run) -> None:
        live = [i for i, w in enumerate(self.slots) if w.alive() and self.ready(w)]
        if not live:
            return
        i = self.rng.choice(live)
        victim = self.slots[i]
        victim.kill()
        self.armed.pop(victim.pid, None)
        run.kills += 1
        self.slots[i] = self.spawn()
        log(f"SIGKILL {victim.name} (pid {victim.pid}); started {self.slots[i].name}")

    def stop(self) -> None:
        for w in self.slots:
            if w.alive():
                w.proc.send_signal(signal.SIGTERM)
        for w in self.slots:
            try:
                w.terminate(timeout=30)
            except Exception:  # noqa: BLE001 - a worker that will not stop is killed
                w.kill()


def done_count(r: Any, stream: str) -> int | None:
    try:
        return int(r.xlen(stream))
    except Exception:  # noqa: BLE001 - Redis is being restarted: no count this time
        return None  # Redis is restarting


#: Workers are killed while trajectories are pushed and until this share of them is done: on a
#: quiet machine a short run's pushing can end before any replacement has finished starting.
KILL_UNTIL = 0.9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=__doc__.splitlines()[0])
    p.add_argument("--trajectories", type=int, default=2000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--max-outputs", type=int, default=8)
    p.add_argument("--rate", type=float, default=50.0, help="trajectories pushed per second")
    p.add_argument(
        "--kill-every",
        type=float,
        nargs=2,
        default=(2.0, 4.0),
        metavar=("MIN", "MAX"),
        help="seconds between SIGKILLs (uniform) of workers that have finished starting",
    )
    p.add_argument("--armed-share", type=float, default=0.3, help="share of replacements armed with a fault")
    p.add_argument("--restart-at", type=float, default=0.4, help="crash Redis after this share is pushed")
    p.add_argument("--score-delay", type=float, default=0.3, help="max seconds one scoring takes")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--timeout", type=float, default=TIMEOUT_DEFAULT, help="give up after this many seconds")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, AOF) for inspection")
    args = p.parse_args(argv)

    from rewardq.queue.keys import Keyspace
    from tests.support.exactly_once import settle
    from tests.support.redis_server import RedisServer

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)
    ns = f"faults-{uuid.uuid4().hex[:8]}"
    log_dir = tempfile.mkdtemp(prefix="rewardq-faults-")
    jobs = make_workload(args.trajectories, seed, args.max_outputs)
    expected = {f"{j.uid}_s_{i}": j.reward for j in jobs for i in range(len(j.outputs))}
    extra = {f"{j.uid}_s_{i}": {"index": n} for n, j in enumerate(jobs) for i in range(len(j.outputs))}
    settings = dict(
        manager="naive",
        reward_fn="benchmarks.faults:slow_gsm8k",
        reward_fn_kwargs={"delay": args.score_delay},
        concurrency=16,
        batch_size=64,
        heartbeat_interval=0.5,
        lease_seconds=2.5,
        claim_idle=3.0,
        maintenance_interval=0.5,
        block_ms=500,
        max_deliveries=50,
        result_ttl=3600,
        shutdown_grace=5,
        log_level="info",
    )

    def interrupted(signum: int, frame: Any) -> None:  # SIGTERM: still stop every process we started
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    run = Run()
    started = time.monotonic()
    deadline = started + args.timeout
    server = RedisServer(appendonly=True)
    server.start()
    log(
        f"seed={seed} redis=127.0.0.1:{server.port} (AOF) namespace={ns} logs={log_dir} "
        f"trajectories={len(jobs)} keys={len(expected)}"
    )
    fleet = Fleet(server.url, ns, log_dir, settings, rng, args.armed_share)
    producer = None
    verdict = None
    r = server.client()
    try:
        fleet.slots = [fleet.spawn(allow_fault=False) for _ in range(args.workers)]
        producer = threading.Thread(target=produce, args=(server.url, ns, jobs, args.rate, run), daemon=True)
        producer.start()
        ks = Keyspace(ns)
        next_kill = time.monotonic() + rng.uniform(*args.kill_every)
        next_report = time.monotonic()
        done = 0
        redis_down_until = 0.0
        while time.monotonic() < deadline:
            now = time.monotonic()
            fleet.reap(run, redis_down_until)
            if not run.restarts and run.pushed >= args.restart_at * len(jobs):
                log(f"crashing Redis (SIGKILL) with {run.pushed} trajectories pushed, {done} done")
                server.restart(kill=True, down_for=1.0)
                redis_down_until = time.monotonic() + 15.0
                r.close()
                r = server.client()
                run.restarts += 1
                log("Redis is back (AOF replayed)")
            if (not run.produced or done < KILL_UNTIL * len(jobs)) and now >= next_kill:
                fleet.kill_one(run)
                next_kill = now + rng.uniform(*args.kill_every)
            done = done_count(r, ks.done(0)) or done
            if now >= next_report:
                live = sum(w.alive() for w in fleet.slots)
                log(f"pushed={run.pushed} done={done} kills={run.kills} live_workers={live}")
                next_report = now + 5
            if run.produced and done >= len(jobs):
                break
            time.sleep(0.2)
        verdict = settle(
            r, ks, expected, timeout=max(1.0, min(30.0, deadline - time.monotonic())), expected_extra=extra
        )
    finally:
        fleet.stop()
        r.close()
        server.cleanup()
        if not args.keep:
            shutil.rmtree(log_dir, ignore_errors=True)
    elapsed = time.monotonic() - started
    problems = []
    if run.producer_error:
        problems.append(f"producer failed: {run.producer_error}")
    if run.unexpected:
        problems.append(f"workers died unexpectedly: {run.unexpected}")
    if run.kills == 0:
        problems.append("no worker was killed (none had finished starting while there was work): nothing was proven")
    if verdict is not None and any(verdict.leftovers.values()):
        problems.append(f"left over: {verdict.leftovers}")
    if verdict is None:
        print("trajectories=0 keys=0 kills=0 redis_restarts=0 lost=-1 duplicated=-1 errors=-1")
        return 1
    log(
        f"finished in {elapsed:.1f}s: kills={run.kills} (self-inflicted {run.self_kills}), workers started "
        f"{fleet.started}, producer retries {run.producer_retries}; {verdict.explain()}"
    )
    for line in problems:
        log(line)
    print(
        f"trajectories={verdict.trajectories} keys={verdict.keys} kills={run.kills} redis_restarts={run.restarts} "
        f"lost={verdict.lost} duplicated={verdict.duplicated} errors={verdict.errors}",
        flush=True,
    )
    ok = verdict.clean and not problems and run.restarts == 1 and run.pushed == len(jobs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
