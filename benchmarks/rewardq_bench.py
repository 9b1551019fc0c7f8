"""rewardq itself: throughput with one and with two worker processes, then latency on the first.

Each run gets its own namespace. The backlog is written with the producer's own encoding
(:func:`rewardq.producers.core.prepare_trajectory`, what ``RewardClient.put_trajectory``
sends), batched into large pipelines because filling is not what is measured. Workers are
:mod:`benchmarks.worker_runner` processes with the default :class:`~rewardq.config.WorkerConfig`
(``naive`` manager, GSM8K by ``data_source``, demo tokenizer, concurrency 32, batch 256);
they are all set up before any of them reads, and the drain is timed from the first to the
last trajectory that reached the ``done`` stream. Afterwards a sample of reward hashes is
checked against the expected GSM8K scores.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.common import PYTHON, Child, Cleanup, Row, Settings, connect, redis_cpu_seconds, watch_drain
from benchmarks.workload import Trajectory, Workload


def fill(url: str, namespace: str, trajs: Iterable[Trajectory], chunk_bytes: int = 4 << 20) -> tuple[int, int]:
    """Write trajectories into a rewardq namespace; returns ``(trajectories, outputs)``."""
    from rewardq import RewardClient
    from rewardq.producers.core import prepare_trajectory

    client = RewardClient.from_url(url, namespace=namespace, max_backlog=None)
    ks = client.keyspace
    max_bytes = client.settings.max_record_bytes
    pipe, size, nt, no = client.r.pipeline(transaction=False), 0, 0, 0
    try:
        for traj in trajs:
            for put in prepare_trajectory(
                ks, traj.uid, traj.session_id, traj.outputs(), traj.sample(), max_bytes=max_bytes
            ):
                pipe.xadd(ks.stream(put.shard), put.fields)
                data = put.fields["data"]
                assert isinstance(data, bytes)  # the encoded record
                size += len(data)
                no += 1
            nt += 1
            if size >= chunk_bytes:
                pipe.execute()
                pipe, size = client.r.pipeline(transaction=False), 0
        pipe.execute()
    finally:
        client.close()
    return nt, no


#: ``--scorer trivial``: the workers run this manager instead of ``naive``
TRIVIAL_MANAGER = "benchmarks.trivial:TrivialManager"


def start_workers(s: Settings, namespace: str, n: int, tag: str, extra: list[str] | None = None) -> list[Child]:
    """Start ``n`` gated workers and wait until every one is set up (not yet reading)."""
    # REWARDQ_BENCH_WORKER=path/to/script.py: an instrumented stand-in for the runner (experiments)
    runner = (
        [os.environ["REWARDQ_BENCH_WORKER"]]
        if os.environ.get("REWARDQ_BENCH_WORKER")
        else ["-m", "benchmarks.worker_runner"]
    )
    manager = ["--manager", TRIVIAL_MANAGER] if s.scorer == "trivial" else []
    children = [
        Child(
            [
                PYTHON,
                *runner,
                *("--url", s.redis_url, "--namespace", namespace, "--name", f"{tag}-w{i}"),
                *manager,
                *(extra or []),
            ],
            s.workdir / f"{namespace}-w{i}.log",
            handshake=True,
            env=_profile_env(s, namespace) if (i == 0 and s.profiler == "pyinstrument") else None,
        )
        for i in range(n)
    ]
    for c in children:
        c.wait_ready(s.start_timeout)
    return children


def _profile_env(s: Settings, namespace: str) -> dict[str, str]:
    return {"BENCH_PYINSTRUMENT": str(s.workdir / f"{namespace}.pyinstrument.txt")}


def done_count(r: Any, namespace: str) -> int:
    from rewardq.queue.keys import Keyspace

    return int(r.xlen(Keyspace(namespace).done(0)))


def check_rewards(r: Any, namespace: str, trajs: list[Trajectory], scorer: str = "gsm8k") -> str:
    """Read the first and final key of sampled trajectories; ``ok`` when all match."""
    from rewardq.queue.keys import Keyspace

    ks = Keyspace(namespace)
    pipe = r.pipeline(transaction=False)
    for t in trajs:
        pipe.hmget(ks.reward_key(t.keys[0]), "status", "reward_score")
        pipe.hmget(ks.reward_key(t.keys[-1]), "status", "reward_score")
    got = pipe.execute()
    bad = 0
    for i, t in enumerate(trajs):
        for status, score in got[2 * i : 2 * i + 2]:
            if status != b"ok" or score is None or float(score) != t.expected_for(scorer):
                bad += 1
    return "ok" if bad == 0 else f"{bad}/{2 * len(trajs)} wrong"


def command_deltas(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[int, int, str]]:
    """``(microseconds, calls, command)`` of every command Redis ran between two ``INFO
    commandstats`` (all clients), most time first."""
    rows = []
    for name, st in after.items():
        b = before.get(name, {"calls": 0, "usec": 0})
        calls, usec = st["calls"] - b["calls"], st["usec"] - b["usec"]
        if calls > 0:
            rows.append((usec, calls, name.removeprefix("cmdstat_")))
    return sorted(rows, reverse=True)


def commandstats_delta(before: dict[str, Any], after: dict[str, Any], trajectories: int) -> str:
    """Redis server time per command during the drain (``INFO commandstats``, all clients)."""
    rows = command_deltas(before, after)
    total = sum(u for u, _, _ in rows) or 1
    lines = [
        f"Redis server time by command during the 1-worker drain ({trajectories} trajectories; "
        f"includes any other client of this Redis): {total / 1000:.0f} ms total, "
        f"{total / max(1, trajectories):.0f} us per trajectory"
    ]
    lines += [
        f"  {100 * u / total:5.1f}%  {c:8d} calls  {u / max(1, c):8.1f} us/call  "
        f"{u / max(1, trajectories):7.1f} us/traj  {n}"
        for u, c, n in rows[:12]
    ]
    return "\n".join(lines) + "\n"


class PySpy:
    """``py-spy record`` attached to a running worker, stopped with SIGINT (it then writes)."""

    def __init__(self, pid: int, out: str, rate: int = 250) -> None:
        self.out = out
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.proc = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--format",
                "raw",
                "--threads",
                "--output",
                out,
                # REWARDQ_BENCH_NATIVE=1: C frames too (pauses the worker to sample)
                *(["--native"] if os.environ.get("REWARDQ_BENCH_NATIVE") else ["--nonblocking"]),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        time.sleep(0.5)  # let it attach before the workers start reading

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            _, err = self.proc.communicate()
        return (err or b"").decode("utf-8", "replace")


def throughput(s: Settings, cleanup: Cleanup, workers: int, keep_first: bool = False) -> tuple[Row, Child | None, str]:
    """Fill ``s.trajectories``, start ``workers`` processes, time the drain.

    Returns the row, the first worker when ``keep_first`` (still running, for the latency
    phase), and the namespace.
    """
    ns = s.prefix(f"rewardq{workers}w")
    cleanup.add(f"{ns}:*")
    wl = Workload(s.seed, tag=f"rq{workers}-")
    nt, no = fill(s.redis_url, ns, wl.range(0, s.trajectories))
    r = connect(s.redis_url)
    children = start_workers(s, ns, workers, f"{s.run_id}-{workers}")
    spy = None
    try:
        if s.profiler == "py-spy" and workers == 1:
            spy = PySpy(children[0].pid, str(s.workdir / f"{ns}.folded"))
        stats0 = r.info("commandstats") if s.profiler and workers == 1 else None
        for c in children:
            c.go()
        d = watch_drain(
            lambda: done_count(r, ns),
            nt,
            s.drain_timeout,
            alive=lambda: all(c.alive() for c in children),
            snaps={"cpu": lambda: sum(c.cpu_seconds() for c in children), "redis": lambda: redis_cpu_seconds(r)},
        )
        rss = max((c.peak_rss_mb() or 0.0) for c in children)
        if stats0 is not None:
            (s.workdir / f"{ns}.redis.txt").write_text(commandstats_delta(stats0, r.info("commandstats"), d.last_count))
        note = (
            "default WorkerConfig, trivial manager (benchmarks.trivial)"
            if s.scorer == "trivial"
            else "default WorkerConfig, naive manager"
        )
        if spy is not None:
            err = spy.stop()
            note += " (py-spy attached: numbers perturbed)"
            if not os.path.exists(spy.out):
                note += f"; py-spy failed: {err.strip()[-200:]}"
            spy = None
        sample = [wl[i] for i in range(0, nt, max(1, nt // 50))]
        row = Row(
            "rewardq",
            "throughput",
            workers,
            outputs=round(no * d.last_count / nt) if nt else 0,
            rss_mb=rss,
            check=check_rewards(r, ns, sample, s.scorer),
            note=note,
            **d.row_fields(nt, no),
        )
        if not d.complete and not all(c.alive() for c in children):
            row.status = f"error: a worker died ({children[0].log_tail(300)})"
        kept = children[0] if keep_first else None
        for c in children:
            if c is not kept:
                c.stop()
        return row, kept, ns
    except BaseException:
        for c in children:
            c.stop()
        raise
    finally:
        if spy is not None:
            spy.stop()
        r.close()


def run(s: Settings, cleanup: Cleanup) -> list[Row]:
    """One worker (then latency on it), then two workers."""
    from benchmarks import latency

    rows: list[Row] = []
    if "throughput" in s.phases:
        row, worker, ns = throughput(s, cleanup, 1, keep_first="latency" in s.phases)
        rows.append(row)
        try:
            if worker is not None:
                rows.append(latency.rewardq_latency(s, ns, worker))
        finally:
            if worker is not None:
                worker.stop()
            cleanup.run([f"{ns}:*"])
        if s.two_workers:
            row2, _, ns2 = throughput(s, cleanup, 2)
            cleanup.run([f"{ns2}:*"])
            rows.append(row2)
    elif "latency" in s.phases:
        ns = s.prefix("rewardq-lat")
        cleanup.add(f"{ns}:*")
        worker = start_workers(s, ns, 1, f"{s.run_id}-lat")[0]
        try:
            worker.go()
            rows.append(latency.rewardq_latency(s, ns, worker))
        finally:
            worker.stop()
            cleanup.run([f"{ns}:*"])
    return rows
