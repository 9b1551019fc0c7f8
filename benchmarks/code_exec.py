"""``python -m benchmarks.code_exec``: what the local code runner costs.

Two numbers, measured in one run on this machine:

1. **Isolation overhead per program**: the median wall time of running one small
   stdin/stdout program (read a number, print its square) through the local sandbox (one
   harness start, one run) minus the median of a bare ``subprocess.run([python, prog.py])``
   of the same program; also against the program with ``prime_code``'s import preamble
   (what every run executes, sandboxed or not). All sequential, ``--programs`` times each,
   after one warm-up.
2. **Code trajectories per second per core**: ``--trajectories`` responses to a 3-case problem
   (80 % right: one run; 20 % partly right: one first pass and three single-case runs, as
   ``prime_code`` does), scored through :class:`~rewardq.reward.codeexec.runtime.CodeRuntime`
   with one sandbox per CPU; the rate is trajectories divided by the CPU seconds the scoring
   used (this process plus every child: ``getrusage``), so it does not depend on how busy
   the machine is; the wall-clock rate is printed next to it.

   The same for ``assert_case`` tests (a 3-case problem, each case run in a fresh process of one
   job, with the tripwires armed: :mod:`rewardq.reward.codeexec.asserts`), and the median of one
   run of a program that imports numpy (its import runs in each such job).

3. **Neighbours** (as root): a correct program needing 3 s of CPU, run beside a ``setsid``
   fork bomb that spins with SIGALRM ignored (and, with job cgroups, a program forking 8
   children of 900 MB each): its score, wall time and job time, with and without job
   cgroups in the same run (without them the forker is left out: it would take 7 GB).

Every sandboxed figure is measured twice in the same run: with a cgroup per job (what the
worker does) and without (``LocalSandbox(job_cgroups=False)``, the isolation before job
cgroups existed), so the cost of the cgroups is a difference within one run.

``--isolation namespaces|rlimits`` picks the sandbox (default: ``namespaces`` as root, else
``rlimits``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rewardq.reward.codeexec.cases import PRIME_PREAMBLE, prime_module_source
from rewardq.reward.codeexec.runtime import CodeRuntime
from rewardq.reward.codeexec.sandbox import LocalSandbox, Program, RunSpec
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.scoring import compute_score_async

PROGRAM = "n = int(input())\nprint(n * n)\n"
PARTIAL = "n = int(input())\nprint(n * n if n < 3 else 0)\n"
SQUARES = json.dumps({"inputs": ["1\n", "2\n", "3\n"], "outputs": ["1\n", "4\n", "9\n"]})


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def bare_runs(n: int, source: str = PROGRAM) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prog.py"
        path.write_text(source)
        times = []
        for _ in range(n + 1):
            t = time.perf_counter()
            out = subprocess.run([sys.executable, str(path)], input="4\n", capture_output=True, text=True, check=True)
            times.append(time.perf_counter() - t)
            assert out.stdout == "16\n"
        return times[1:]


async def sandbox_runs(n: int, isolation: str, cgroups: bool = True) -> tuple[list[float], str]:
    sandbox = LocalSandbox(isolation=isolation, max_concurrent=1, job_cgroups=cgroups)
    program = Program(prime_module_source(PROGRAM, None), None, False, ["4\n"])
    await sandbox.start()
    times = []
    for _ in range(n + 1):
        t = time.perf_counter()
        [run] = await sandbox.execute(program, [RunSpec([0], 5, 6.0)])
        times.append(time.perf_counter() - t)
        assert run.records[1] == {"case": 0, "out": "16\n"}, run.records
    return times[1:], str(sandbox.isolation)


async def throughput(n: int, isolation: str, cgroups: bool = True) -> dict[str, float]:
    runtime = CodeRuntime(CodeExecSettings(code_local_isolation=isolation))
    runtime._sandbox = LocalSandbox(isolation=isolation, job_cgroups=cgroups)
    await runtime.sandbox().start()
    completions = [f"```python\n{PARTIAL if i % 5 == 0 else PROGRAM}```" for i in range(n)]
    cpu, wall = _cpu(), time.perf_counter()
    results = await asyncio.gather(
        *(compute_score_async("taco", c, SQUARES, code_runtime=runtime) for c in completions)
    )
    cpu, wall = _cpu() - cpu, time.perf_counter() - wall
    assert all(isinstance(r, dict) for r in results)  # a detailed score each
    assert [r["score"] for r in results if isinstance(r, dict)] == [2 / 3 if i % 5 == 0 else 1.0 for i in range(n)]
    runs = runtime.stats.snapshot()["taco"]["runs"]
    return {"trajectories": n, "programs": runs, "cpu_s": cpu, "wall_s": wall, "per_core_s": n / cpu, "per_s": n / wall}


ASSERTS = json.dumps(
    {"assert_case": ["assert sq(1) == 1", "assert sq(2) == 4", "assert sq(3) == 9\nassert sq(0) == 0"]}
)
SQ, SQ_PARTIAL = "def sq(n):\n    return n * n\n", "def sq(n):\n    return n * n if n < 3 else 0\n"
NUMPY_PROGRAM = "import numpy as np\nn = int(input())\nprint(int(np.int64(n) ** 2))\n"


async def assert_throughput(n: int, isolation: str, cgroups: bool = True) -> dict[str, float]:
    """:func:`throughput` for ``assert_case`` responses (80 % right, 20 % one case of three wrong)."""
    runtime = CodeRuntime(CodeExecSettings(code_local_isolation=isolation))
    runtime._sandbox = LocalSandbox(isolation=isolation, job_cgroups=cgroups)
    await runtime.sandbox().start()
    completions = [f"```python\n{SQ_PARTIAL if i % 5 == 0 else SQ}```" for i in range(n)]
    cpu, wall = _cpu(), time.perf_counter()
    results = await asyncio.gather(
        *(compute_score_async("taco", c, ASSERTS, code_runtime=runtime) for c in completions)
    )
    cpu, wall = _cpu() - cpu, time.perf_counter() - wall
    scores = [r["score"] for r in results if isinstance(r, dict)]
    assert scores == [2 / 3 if i % 5 == 0 else 1.0 for i in range(n)], scores[:10]
    runs = runtime.stats.snapshot()["taco"]["runs"]
    return {"trajectories": n, "programs": runs, "cpu_s": cpu, "wall_s": wall, "per_core_s": n / cpu, "per_s": n / wall}


async def numpy_runs(n: int, isolation: str) -> list[float]:
    """One run of a program importing numpy, ``n`` times (after a warm-up)."""
    sandbox = LocalSandbox(isolation=isolation, max_concurrent=1)
    program = Program(prime_module_source(NUMPY_PROGRAM, None), None, False, ["4\n"])
    await sandbox.start()
    times = []
    for _ in range(n + 1):
        t = time.perf_counter()
        [run] = await sandbox.execute(program, [RunSpec([0], 10, 11.0)])
        times.append(time.perf_counter() - t)
        assert {"case": 0, "out": "16\n"} in run.records, run.records
    return times[1:]


CPU_3S = (
    "import time\nt = time.process_time()\nwhile time.process_time() - t < 3:\n    pass\nprint(int(input()) ** 2)\n"
)
SPINNER = (
    "import posix, signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nfor _ in range(64):\n    try:\n"
    "        if posix.fork() == 0:\n            posix.setsid()\n            while True:\n                pass\n"
    "    except OSError:\n        break\nwhile True:\n    pass\n"
)
FORKER = (
    "import posix, time\nfor _ in range(8):\n    if posix.fork() == 0:\n"
    "        block = b'x' * (900 * 1024 * 1024)\n        while True:\n            time.sleep(1)\n"
    "while True:\n    time.sleep(1)\n"
)


async def neighbours(isolation: str, cgroups: bool) -> dict[str, float | str]:
    """The 3 s program's first pass (5 s per case, as prime_code's) beside the hostile ones."""
    sandbox = LocalSandbox(isolation=isolation, max_concurrent=3, job_cgroups=cgroups)
    await sandbox.start()
    spec = [RunSpec([0], 5, 6.0)]
    hostile = [SPINNER, FORKER] if cgroups else [SPINNER]
    jobs = [sandbox.execute(Program(prime_module_source(p, None), None, False, ["4\n"]), spec) for p in hostile]
    good = Program(prime_module_source(CPU_3S, None), None, False, ["4\n"])
    await asyncio.sleep(0.5)  # the hostile ones are spinning and allocating
    [run], *_ = await asyncio.gather(sandbox.execute(good, spec), *jobs)
    ok = run.records[-2:] == [{"case": 0, "out": "16\n"}, {"done": True}] and not run.timed_out
    return {
        "result": "passed" if ok else "FAILED (timeout)" if run.timed_out else "FAILED",
        "wall_s": run.seconds,
        "job_s": run.job_seconds,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=50)
    parser.add_argument("--trajectories", type=int, default=200)
    parser.add_argument(
        "--isolation", default="namespaces" if os.geteuid() == 0 else "rlimits", choices=["namespaces", "rlimits"]
    )
    args = parser.parse_args()
    modes = [True, False] if os.geteuid() == 0 else [False]
    bare = statistics.median(bare_runs(args.programs))
    with_preamble = statistics.median(bare_runs(args.programs, PRIME_PREAMBLE + PROGRAM))
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f}")
    print(f"bare subprocess.run                  median {bare * 1000:7.1f} ms  (n={args.programs})")
    print(f"bare subprocess.run, with preamble   median {with_preamble * 1000:7.1f} ms")
    for cgroups in modes:
        label = "job cgroups" if cgroups else "no job cgroups"
        boxed_times, isolation = await sandbox_runs(args.programs, args.isolation, cgroups)
        boxed = statistics.median(boxed_times)
        print(f"local sandbox ({isolation}, {label}), one run  median {boxed * 1000:7.1f} ms")
        print(
            f"  isolation overhead per program     {1000 * (boxed - bare):7.1f} ms "
            f"({1000 * (boxed - with_preamble):.1f} ms beyond the preamble every run imports)"
        )
        tp = await throughput(args.trajectories, args.isolation, cgroups)
        print(
            f"  throughput: {tp['trajectories']} trajectories ({tp['programs']} programs) "
            f"in {tp['wall_s']:.1f} s wall, "
            f"{tp['cpu_s']:.1f} CPU s: {tp['per_core_s']:.1f} trajectories/s per core ({tp['per_s']:.1f}/s wall)"
        )
        at = await assert_throughput(args.trajectories, args.isolation, cgroups)
        print(
            f"  assert_case: {at['trajectories']} trajectories ({at['programs']} programs) "
            f"in {at['wall_s']:.1f} s wall, {at['cpu_s']:.1f} CPU s: {at['per_core_s']:.1f} trajectories/s per core "
            f"({at['per_core_s'] / tp['per_core_s']:.2f}x the prime_code path's)"
        )
        if cgroups or os.geteuid() != 0:
            with_numpy = statistics.median(await numpy_runs(max(5, args.programs // 5), args.isolation))
            print(
                f"  one run of a program importing numpy  median {with_numpy * 1000:7.1f} ms "
                f"({with_numpy / boxed:.1f}x the plain program's)"
            )
        if os.geteuid() == 0:
            nb = await neighbours(args.isolation, cgroups)
            beside = "spinner + 8 x 900 MB forker" if cgroups else "spinner"
            print(
                f"  3 s CPU program beside the {beside}: {nb['result']}, "
                f"{nb['wall_s']:.2f} s wall, {nb['job_s']:.2f} s job time (limit 5 s)"
            )


if __name__ == "__main__":
    asyncio.run(main())
