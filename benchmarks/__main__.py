"""``python -m benchmarks``: rewardq against a raw Redis-Streams loop and four task queues.

Usage::

    python -m benchmarks                       # everything, ~12-15 minutes
    python -m benchmarks --quick               # every phase, small sizes, ~1-1.5 minutes
    python -m benchmarks --only raw,rewardq --trajectories 200 --json out.json
    python -m benchmarks --scorer trivial      # the issue's reference conditions: no decode

Systems (``--only``): ``raw`` (baseline, also its no-scoring variant), ``rewardq``
(throughput with 1 and 2 workers, latency, memory), ``ledger`` (rewardq with and without the
reward ledger, and provenance's cost: :mod:`benchmarks.ledger_bench`), ``celery``, ``rq``,
``arq``, ``dramatiq``. Phases (``--phases``): ``throughput``, ``latency``, ``memory``. Every key
this run writes carries ``rqbench-<run id>`` (or the peer's own prefix with the run id)
and is deleted at the end; every process it starts is stopped by its PID.

What is measured can be changed with ``--scorer gsm8k|trivial`` (decode + GSM8K regex, or a
decode-free score: the issue's reference conditions), ``--latency-mode final|whole`` (clock
from the final output's put after the others went in untimed, or one put of every output)
and ``--one-worker`` (skip the two-worker drain). For experiments: ``REWARDQ_BENCH_NATIVE=1``
makes ``--profile py-spy`` sample C frames too, ``REWARDQ_BENCH_WORKER=script.py`` runs an
instrumented stand-in for :mod:`benchmarks.worker_runner` (same arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from benchmarks.common import PYTHON, REPO, Cleanup, Row, Settings, connect, installed, stop_all_children
from benchmarks.report import ratios, render, targets

SYSTEMS = ("raw", "rewardq", "ledger", "celery", "rq", "arq", "dramatiq")
PHASES = ("throughput", "latency", "memory")


def settings_from_args(a: argparse.Namespace) -> Settings:
    s = Settings(redis_url=a.url, seed=a.seed)
    if a.quick:
        s.quick = True
        s.trajectories, s.drain_timeout = 600, 45.0
        s.latency_samples, s.latency_rate, s.latency_warmup, s.latency_timeout = 60, 50.0, 10, 20.0
        s.backlogs, s.memory_process, s.memory_timeout = (500, 5000), 300, 45.0
    if a.trajectories:
        s.trajectories = a.trajectories
    if a.latency_samples:
        s.latency_samples = a.latency_samples
        s.latency_warmup = min(s.latency_warmup, max(1, a.latency_samples // 5))
    if a.latency_rate:
        s.latency_rate = a.latency_rate
    s.latency_mode = a.latency_mode
    s.two_workers = not a.one_worker
    s.scorer = a.scorer
    if a.backlogs:
        s.backlogs = tuple(int(x) for x in a.backlogs.split(","))
        s.memory_process = min(s.memory_process, min(s.backlogs))
    s.systems = tuple(x.strip() for x in a.only.split(",")) if a.only else SYSTEMS
    s.phases = tuple(x.strip() for x in a.phases.split(",")) if a.phases else PHASES
    for x in s.systems:
        if x not in SYSTEMS:
            raise SystemExit(f"unknown system {x!r} in --only; choose from {','.join(SYSTEMS)}")
    for x in s.phases:
        if x not in PHASES:
            raise SystemExit(f"unknown phase {x!r} in --phases; choose from {','.join(PHASES)}")
    s.profiler = a.profile
    for spec in a.peer_path:
        peer, sep, path = spec.partition("=")
        if not sep or peer not in SYSTEMS[3:]:
            raise SystemExit(f"--peer-path wants PEER=DIR with PEER one of {','.join(SYSTEMS[3:])}, got {spec!r}")
        s.peer_paths[peer] = path
    s.run_id = f"{os.getpid():x}{int(time.time()) % 100000:05d}"
    s.workdir = Path(tempfile.mkdtemp(prefix=f"rqbench-{s.run_id}-"))
    return s


def run_system(name: str, s: Settings, cleanup: Cleanup) -> list[Row]:
    """The rows of one system; a missing peer is one 'not installed' row, a crash one 'error' row."""
    try:
        if name == "raw":
            from benchmarks import raw

            rows = raw.run(s, cleanup)
            if "throughput" in s.phases and s.scorer != "trivial":  # with the trivial scorer raw *is* that
                rows += raw.run(s, cleanup, trivial=True)
            return rows
        if name == "rewardq":
            from benchmarks import memory, rewardq_bench

            rows = rewardq_bench.run(s, cleanup)
            if "memory" in s.phases:
                rows += memory.run(s, cleanup)
            return rows
        if name == "ledger":
            from benchmarks import ledger_bench

            return ledger_bench.run(s, cleanup)
        if name in s.peer_paths:
            return run_elsewhere(name, s, s.peer_paths[name])
        module = {"celery": "celery", "rq": "rq", "arq": "arq", "dramatiq": "dramatiq"}[name]
        if not installed(module):
            hint = (
                "pip install --target .peers/celery 'redis[hiredis]>=6.1'; then --peer-path celery=.peers/celery"
                if name == "celery"
                else "pip install -c constraints.txt -e '.[bench]'"
            )
            return [Row(name, "throughput", status="not installed", note=hint)]
        import importlib

        bench = importlib.import_module(f"benchmarks.peers.{name}_bench")
        result: list[Row] = bench.run(s, cleanup)
        return result
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - one peer's failure is a row of the table, not the end of the run
        traceback.print_exc(file=sys.stderr)
        return [Row(name, "-", status=f"error: {type(exc).__name__}: {str(exc)[:300]}")]
    finally:
        stop_all_children()


def run_elsewhere(name: str, s: Settings, path: str) -> list[Row]:
    """Run one peer in a child ``python -m benchmarks`` with ``path`` first on PYTHONPATH.

    For a peer whose dependencies clash with the environment's (Celery's kombu needs
    redis-py >= 6.1 where arq pins < 6): the child measures it with the same settings,
    its own keys and processes, and hands its rows back as JSON.
    """
    out = s.workdir / f"{name}.json"
    argv = [
        PYTHON,
        "-m",
        "benchmarks",
        "--only",
        name,
        "--phases",
        ",".join(s.phases),
        "--url",
        s.redis_url,
        "--seed",
        str(s.seed),
        "--trajectories",
        str(s.trajectories),
        "--latency-samples",
        str(s.latency_samples),
        "--latency-rate",
        str(s.latency_rate),
        "--latency-mode",
        s.latency_mode,
        "--scorer",
        s.scorer,
        "--json",
        str(out),
    ]
    if s.quick:
        argv.append("--quick")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (path, os.environ.get("PYTHONPATH")) if x)}
    budget = 3 * s.drain_timeout + 2 * s.latency_timeout + 2 * s.start_timeout
    proc = subprocess.run(argv, env=env, cwd=str(REPO), capture_output=True, text=True, timeout=budget)
    if proc.returncode != 0 or not out.exists():
        return [Row(name, "-", status=f"error: child run failed ({proc.stderr.strip()[-300:]})")]
    rows = []
    for d in json.loads(out.read_text())["rows"]:
        d.pop("extra", None)
        row = Row(**d)
        row.note = f"{row.note}; PYTHONPATH+={path}".strip("; ")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: every phase in about a minute")
    p.add_argument("--only", help=f"comma-separated systems ({','.join(SYSTEMS)})")
    p.add_argument("--phases", help=f"comma-separated phases ({','.join(PHASES)})")
    p.add_argument("--trajectories", type=int, help="throughput backlog per system (default 4000, quick 600)")
    p.add_argument("--latency-samples", type=int, help="measured trajectories in the latency phase")
    p.add_argument("--latency-rate", type=float, help="trajectories per second in the latency phase")
    p.add_argument(
        "--latency-mode",
        choices=["final", "whole"],
        default="final",
        help="final (default): time from the final output's put, outputs 0..n-2 put before it "
        "untimed; whole: time one put of every output (peers: one job either way)",
    )
    p.add_argument(
        "--scorer",
        choices=["gsm8k", "trivial"],
        default="gsm8k",
        help="gsm8k (default): decode the final response + strict regex, in every system; "
        "trivial: no decode (reward = parity of the final response length), the issue's "
        "reference conditions for queue overhead",
    )
    p.add_argument(
        "--one-worker", action="store_true", help="rewardq's throughput with one worker process only (quicker A/B runs)"
    )
    p.add_argument("--backlogs", help="memory phase backlog sizes (default 1000,100000; quick 500,5000)")
    p.add_argument("--json", help="also write every row, target and setting to this file")
    p.add_argument("--url", default=os.environ.get("REWARDQ_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--profile",
        choices=["py-spy", "pyinstrument"],
        help="profile the 1-worker rewardq drain (perturbs its numbers)",
    )
    p.add_argument("--profile-out", help="write the profile summary here (default: print it)")
    p.add_argument(
        "--peer-path",
        action="append",
        default=[],
        metavar="PEER=DIR",
        help="run PEER in a child run with DIR first on PYTHONPATH (e.g. celery=DIR holding "
        "redis-py>=6.1 when arq pinned it below 6)",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the workers' logs (the path is printed)")
    a = p.parse_args(argv)
    s = settings_from_args(a)
    console = Console(width=220)
    r = connect(s.redis_url)
    try:
        r.ping()
    except Exception as exc:  # noqa: BLE001 - whatever stops the PING, the run cannot start: say so and exit 2
        console.print(f"[red]Redis is not reachable at {s.redis_url}: {exc}[/]")
        return 2
    finally:
        r.close()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    cleanup = Cleanup(s.redis_url)
    cleanup.add(f"rqbench-{s.run_id}-*")  # every key of the run carries its id, whichever system wrote it
    rows: list[Row] = []
    t0 = time.perf_counter()
    try:
        for name in s.systems:
            console.print(f"[bold]{name}[/] ...", highlight=False)
            t = time.perf_counter()
            rows += run_system(name, s, cleanup)
            console.print(f"  {name} done in {time.perf_counter() - t:.1f}s", highlight=False)
    except KeyboardInterrupt:
        console.print("[red]interrupted: stopping workers and deleting keys[/]")
    finally:
        stop_all_children()
        cleanup.run()
    ratios(rows)
    tgts = targets(rows)
    render(
        rows,
        tgts,
        console,
        title=f"rewardq benchmark{' (quick)' if s.quick else ''}: "
        f"{s.trajectories} trajectories of 1-8 outputs, ~500 + 1,000-4,000 ids, "
        f"{'trivial scorer (no decode)' if s.scorer == 'trivial' else 'GSM8K scoring'}; "
        f"latency from the {'final output' if s.latency_mode == 'final' else 'whole'} put; "
        f"{os.cpu_count()} cores; {time.perf_counter() - t0:.0f}s",
    )
    if s.profiler:
        report_profile(s, console, a.profile_out)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items()},
                    "machine": {
                        "python": platform.python_version(),
                        "cpus": os.cpu_count(),
                        "platform": platform.platform(),
                    },
                    "rows": [x.as_dict() for x in rows],
                    "targets": [asdict(g) for g in tgts],
                },
                f,
                indent=1,
            )
    if a.keep_logs:
        console.print(f"logs kept in {s.workdir}")
    else:
        shutil.rmtree(s.workdir, ignore_errors=True)
    return 0


def report_profile(s: Settings, console: Console, out: str | None) -> None:
    from benchmarks.profiling import summarize

    folded = next(iter(s.workdir.glob("*.folded")), None)
    text_file = next(iter(s.workdir.glob("*.pyinstrument.txt")), None)
    if folded is not None:
        text = summarize(folded)
    elif text_file is not None:
        text = text_file.read_text()
    else:
        text = "no profile was written (see the worker logs with --keep-logs)\n"
    for extra in s.workdir.glob("*.redis.txt"):
        text += "\n" + extra.read_text()
    if out:
        Path(out).write_text(text)
        if folded is not None:
            shutil.copy(folded, Path(out).with_suffix(".folded"))
        console.print(f"profile summary written to {out}")
    else:
        console.print(text, highlight=False)


if __name__ == "__main__":
    sys.exit(main())
