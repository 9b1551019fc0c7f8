"""``python -m benchmarks.verl_loop``: verl's own reward loop beside rewardq, driven by verl's classes.

Run it from a verl 0.9.1 environment with rewardq and the ``bench-verl`` extra installed (the
``.venv-verl`` that ``.ci/run`` builds, plus ``pip install -e '.[bench-verl]'``)::

    python -m benchmarks.verl_loop                      # full size, ~25-35 minutes on 2 cores
    python -m benchmarks.verl_loop --smoke              # every scorer, tiny sizes, ~2 minutes
    python -m benchmarks.verl_loop --scorers gsm8k --sizes 2 --json out.json

For each scorer (GSM8K, math-verify as a custom reward function, code through each system's
local runner) and each size (1 and 2 rewardq workers against 1 and 2 verl ``RewardLoopWorker``
actors), each system runs alone in a process of its own (:mod:`benchmarks.verl_loop.side`):
warm-up, ``--rounds`` bursts, then the steady phase. Before any of them, every trajectory's
reference reward is computed once (:mod:`benchmarks.verl_loop.reference`; for math-verify in a
bare ``ProcessPoolExecutor``, whose time is the baseline of the scorer-process pool). The tables
compare the two systems measured minutes apart on the same machine; ``--repeat`` runs the
whole comparison again for the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.procfs import load
from benchmarks.verl_loop.report import render, targets
from benchmarks.verl_loop.trajectories import SCORERS, Trajectories

REPO = Path(__file__).resolve().parents[2]
#: Per scorer: burst size, steady samples and rate (full size; --smoke shrinks them).
FULL = {
    "gsm8k": {"burst": 2048, "steady": 600, "rate": 20.0},
    "math_verify": {"burst": 2048, "steady": 300, "rate": 10.0},
    "code": {"burst": 256, "steady": 100, "rate": 5.0},
}
SMOKE = {
    "gsm8k": {"burst": 24, "steady": 12, "rate": 10.0},
    "math_verify": {"burst": 16, "steady": 8, "rate": 8.0},
    "code": {"burst": 8, "steady": 4, "rate": 4.0},
}


def scorer_plans(a: argparse.Namespace) -> list[dict[str, Any]]:
    plans = []
    base = SMOKE if a.smoke else FULL
    for name in a.scorers.split(","):
        if name not in SCORERS:
            raise SystemExit(f"unknown scorer {name!r}; choose from {','.join(SCORERS)}")
        p = dict(base[name], name=name, rounds=1 if a.smoke else a.rounds)
        if a.burst:
            p["burst"] = a.burst if name != "code" else max(8, a.burst // 8)
        if a.steady is not None:
            p["steady"] = a.steady if name == "gsm8k" else max(0, a.steady // 2)
        p["warm"] = 2 if a.smoke else 8
        p["steady_warmup"] = min(20, p["steady"] // 5)
        plans.append(p)
    return plans


def references(plans: list[dict[str, Any]], seed: int, workdir: Path, smoke: bool) -> dict[str, str]:
    """Compute and store the references of every trajectory any phase will submit."""
    from benchmarks.verl_loop import reference

    paths = {}
    for p in plans:
        t0 = time.perf_counter()
        trajs = Trajectories(p["name"], seed)
        burst = trajs.range(0, p["burst"])
        # code: run verl's prime_code for the references only at smoke size (see reference.compute)
        refs = reference.compute(p["name"], burst, baseline=p["name"] != "code" or smoke)
        rest = reference.compute(p["name"], trajs.range(p["burst"], p["steady"] + p["warm"]))
        refs.right.update(rest.right)
        refs.verl.update(rest.verl)
        path = workdir / f"refs-{p['name']}.json"
        path.write_text(json.dumps(refs.as_json()))
        paths[p["name"]] = str(path)
        cut = sum(1 for i in refs.right if refs.right[i] != refs.verl[i])
        base = refs.baseline
        note = (
            f"; bare ProcessPoolExecutor x{base.processes}: {base.calls / base.wall_s:.0f} calls/s, "
            f"function CPU {base.function_cpu_s:.1f}s"
            if base
            else ""
        )
        print(
            f"references {p['name']}: {len(refs.right)} trajectories, verl's padding changes {cut} of them, "
            f"{time.perf_counter() - t0:.1f}s{note}",
            file=sys.stderr,
            flush=True,
        )
    return paths


def run_side(
    system: str, size: int, plans: list[dict[str, Any]], common: dict[str, Any], workdir: Path
) -> list[dict[str, Any]]:
    out = workdir / f"{system}-{size}-{time.time_ns()}.json"
    plan = {**common, "system": system, "size": size, "scorers": plans, "out": str(out)}
    path = out.with_suffix(".plan.json")
    path.write_text(json.dumps(plan))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.verl_loop.side", str(path)], cwd=str(REPO), env=env, timeout=7200
    )
    if proc.returncode != 0 or not out.exists():
        print(f"{system} x{size} failed (exit {proc.returncode})", file=sys.stderr)
        return [{"system": system, "size": size, "status": f"error: exit {proc.returncode}"}]
    result: list[dict[str, Any]] = json.loads(out.read_text())
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.verl_loop", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one round (the tests/verl smoke run)")
    p.add_argument("--scorers", default=",".join(SCORERS), help=f"comma-separated ({','.join(SCORERS)})")
    p.add_argument("--sizes", default="1,2", help="rewardq workers = verl actors (default 1,2)")
    p.add_argument("--systems", default="verl,rewardq", help="verl,rewardq (default both)")
    p.add_argument("--rounds", type=int, default=2, help="bursts per scorer and size (default 2)")
    p.add_argument("--burst", type=int, help="trajectories per burst (code gets 1/8 of it)")
    p.add_argument("--steady", type=int, help="steady-phase trajectories (math-verify and code get half)")
    p.add_argument("--repeat", type=int, default=1, help="run the whole comparison this many times")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every result and target here")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, plans)")
    p.add_argument(
        "--pinned",
        action="store_true",
        help="lay the sides out as a cluster: the producer side on one core, the reward side on the other",
    )
    a = p.parse_args(argv)
    from benchmarks.verl_loop.tokenizer import tokenizer_folder

    workdir = Path(tempfile.mkdtemp(prefix="rqb-verl-loop-"))
    plans = scorer_plans(a)
    sizes = [int(x) for x in a.sizes.split(",")]
    systems = [x.strip() for x in a.systems.split(",")]
    started = time.perf_counter()
    loads = [load()]
    common: dict[str, Any] = {"seed": a.seed, "tokenizer": str(tokenizer_folder()), "workdir": str(workdir)}
    common["refs"] = references(plans, a.seed, workdir, a.smoke)
    if a.pinned:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            p.error("--pinned needs 2 cores")
        half = len(cpus) // 2
        common["pin"] = {"producer": cpus[:half], "reward": cpus[half:]}
        print(f"pinned: producer side on cores {cpus[:half]}, reward side on {cpus[half:]}", file=sys.stderr)
    results: list[dict[str, Any]] = []
    for rep in range(a.repeat):
        for size in sizes:
            for system in systems:
                print(f"{system} with {size} worker(s), repeat {rep + 1}", file=sys.stderr, flush=True)
                for r in run_side(system, size, plans, common, workdir):
                    results.append({**r, "repeat": rep + 1})
                loads.append(load())
    baselines = {name: json.loads(Path(path).read_text())["baseline"] for name, path in common["refs"].items()}
    tgts = targets(results, baselines, len(common["pin"]["reward"]) if a.pinned else None)
    render(results, tgts, baselines, loads, time.perf_counter() - started)
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "settings": {
                        "scorers": plans,
                        "sizes": sizes,
                        "seed": a.seed,
                        "repeat": a.repeat,
                        "pin": common.get("pin"),
                    },
                    "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "loads": loads},
                    "baselines": baselines,
                    "results": results,
                    "targets": tgts,
                },
                indent=1,
            )
        )
    if a.keep:
        print(f"work folder kept: {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    failed = [r for r in results if str(r.get("status", "ok")).startswith("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
