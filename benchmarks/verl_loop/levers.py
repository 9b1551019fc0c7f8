"""``python -m benchmarks.verl_loop.levers``: what each lever saves, measured A/B in one process.

With the real tokenizer's ids (GSM8K trajectories of :mod:`benchmarks.verl_loop.trajectories`):

* **producer**: CPU per trajectory of ``prepare_trajectory`` (validation + msgpack) on verl's
  ``AgentLoopOutput`` objects, ids as lists (the C-packed path) against the same ids as tuples
  (which take the numpy path every input took before).
* **worker scoring**: CPU and wall per trajectory of :class:`~rewardq.consumers.scorer.TrajectoryScorer`
  with the naive manager on decoded records, all trajectories of a read batch side by side
  (``asyncio.gather``, as the worker runs them): the whole batch and inline decode (what every
  trajectory cost before), the final row only (lazy batch), the final row with batched decode (the
  tokenizer's Rust ``decode_batch`` in the decode thread), and the final row decoded through the
  byte-level table in the event loop (what the worker does with a byte-level BPE tokenizer).
* **scorer processes**: calls per second of rewardq's :class:`~rewardq.reward.execution.process_pool.ScorerPool`
  against a bare ``concurrent.futures.ProcessPoolExecutor`` on the same cores, with a function
  that returns at once (the per-call overhead) and with the math-verify function.

Each variant runs ``--repeat`` times, interleaved; the table gives the median and the spread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from benchmarks.verl_loop.tokenizer import fast_tokenizer, tokenizer_folder
from benchmarks.verl_loop.trajectories import Trajectories


def noop(**kwargs: Any) -> float:
    """The function a per-call overhead is measured with."""
    return 0.0


def _cpu() -> float:
    return time.process_time()


def producer(n: int) -> dict[str, float]:
    from rewardq.integrations.verl.scoring import sample_columns
    from rewardq.producers.core import prepare_trajectory
    from rewardq.queue.keys import Keyspace

    ks = Keyspace("levers")
    trajs = Trajectories("gsm8k", 0).range(0, n)
    items = [(t.verl_outputs(), t.kwargs()) for t in trajs]
    as_tuples = [
        ([{**o.model_dump(), "prompt_ids": tuple(o.prompt_ids), "response_ids": tuple(o.response_ids),
           "response_mask": tuple(o.response_mask)} for o in outs], kw)
        for outs, kw in items
    ]  # fmt: skip

    def run(which: list[tuple[Any, Any]]) -> float:
        t = _cpu()
        for outs, kw in which:
            prepare_trajectory(ks, kw["uid"], "s", outs, sample_columns(kw), max_bytes=64 << 20)
        return 1000 * (_cpu() - t) / n

    return {"lists (C-packed)": run(items), "tuples (numpy path)": run(as_tuples)}


def worker_records(n: int) -> list[list[Any]]:
    from rewardq.queue.codec import decode_output, encode_output

    out = []
    for t in Trajectories("gsm8k", 0).range(0, n):
        outs, kw = t.verl_outputs(), t.kwargs()
        sample = {k: v for k, v in kw.items() if k in ("data_source", "reward_model", "extra_info")}
        out.append(
            [
                decode_output(encode_output(t.uid, "s", i, o, sample, final=i == t.n - 1), vocab_size=130_000)
                for i, o in enumerate(outs)
            ]
        )
    return out


async def scoring(trajs: list[list[Any]], tokenizer: Any, variant: str) -> tuple[float, float]:
    from rewardq.consumers.scorer import TrajectoryScorer
    from rewardq.reward.managers.naive import NaiveRewardManager

    class WholeBatch(NaiveRewardManager):
        reads = "trajectory"

    manager = (WholeBatch if variant == "whole batch, inline decode" else NaiveRewardManager)(tokenizer)
    if variant in ("final row, batched decode", "final row, byte-level table"):
        manager.host._choose_decoder(tokenizer)  # the table is built here, as a worker builds it before serving
    if variant == "final row, batched decode":
        manager.host.table = None  # every response to the decode thread's Rust decode_batch
    elif variant != "final row, byte-level table":
        manager.host.decoder = False  # decode inline, in the event loop, as before
    scorer = TrajectoryScorer(manager, manager_name="naive", worker_name="levers", timeout=600)
    c, t = _cpu(), time.perf_counter()
    results = await asyncio.gather(*(scorer.score(r) for r in trajs))
    cpu, wall = 1000 * (_cpu() - c) / len(trajs), 1000 * (time.perf_counter() - t) / len(trajs)
    await manager.close_scoring()
    assert all(x.results[0].status == "ok" for x in results)
    return cpu, wall


async def pools(n: int, fn_spec: str, kwargs_of: Any, bare_first: bool) -> dict[str, float]:
    """Calls per second of each pool over the same ``n`` calls (both warmed up with 4 calls per
    process), and the CPU its processes spent per call (what the cores gave them: on a loaded
    machine the calls/s ratio is mostly the share of the cores each run got)."""
    from benchmarks.procfs import stat_cpu
    from rewardq.reward.execution.loader import load_score_fn
    from rewardq.reward.execution.process_pool import ScorerPool

    cores = os.cpu_count() or 2
    calls = [kwargs_of(i) for i in range(n)]
    warm = [kwargs_of(n + i) for i in range(4 * cores)]

    def cpu(pids: list[int]) -> float:
        return sum(stat_cpu(p)[0] for p in pids)

    async def ours() -> tuple[float, float]:
        pool = ScorerPool(fn_spec, num_workers=cores)
        await pool.start()
        await asyncio.gather(*(pool.run(c) for c in warm))
        pids = [p for p in pool.pids if p is not None]
        c, t = cpu(pids), time.perf_counter()
        await asyncio.gather(*(pool.run(c) for c in calls))
        rate = n / (time.perf_counter() - t)
        used = 1000 * (cpu(pids) - c) / n
        await pool.close()
        return rate, used

    async def bare() -> tuple[float, float]:
        fn = load_score_fn(fn_spec)
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(cores) as ex:
            await asyncio.gather(*(loop.run_in_executor(ex, _call, (fn, c)) for c in warm))
            pids = list(ex._processes)
            c, t = cpu(pids), time.perf_counter()
            await asyncio.gather(*(loop.run_in_executor(ex, _call, (fn, c)) for c in calls))
            return n / (time.perf_counter() - t), 1000 * (cpu(pids) - c) / n

    got: dict[str, float] = {}
    for name, run in (("ProcessPoolExecutor", bare), ("ScorerPool", ours))[:: 1 if bare_first else -1]:
        rate, used = await run()
        got[f"{name} calls/s"], got[f"{name} process CPU ms/call"] = rate, used
    return got


def _call(args: tuple[Any, dict[str, Any]]) -> Any:
    fn, kwargs = args
    return fn(**kwargs)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.3f}  ({min(values):.3f}-{max(values):.3f})"


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trajectories", type=int, default=256)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sections", default="producer,scoring,pools", help="which of producer,scoring,pools")
    a = p.parse_args()
    sections = set(a.sections.split(","))
    print(
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
        f"real tokenizer ({fast_tokenizer().get_vocab_size()} ids)"
    )
    if "producer" in sections:
        report_producer(a)
    if "scoring" in sections:
        await report_scoring(a)
    if "pools" in sections:
        await report_pools(a)


def report_producer(a: argparse.Namespace) -> None:
    prod: dict[str, list[float]] = {}
    for _ in range(a.repeat):
        for k, v in producer(a.trajectories).items():
            prod.setdefault(k, []).append(v)
    for k, values in prod.items():
        print(f"producer prepare_trajectory, {k:22s} CPU ms/traj {spread(values)}")


async def report_scoring(a: argparse.Namespace) -> None:
    from rewardq.reward.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_folder()))
    trajs = worker_records(a.trajectories)
    variants = [
        "whole batch, inline decode",
        "final row, inline decode",
        "final row, batched decode",
        "final row, byte-level table",
    ]
    got: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for _ in range(a.repeat):
        for v in variants:
            got[v].append(await scoring(trajs, tok, v))
    for v in variants:
        print(
            f"worker scoring, {v:28s} CPU ms/traj {spread([c for c, _ in got[v]])}   "
            f"wall ms/traj {spread([w for _, w in got[v]])}"
        )


async def report_pools(a: argparse.Namespace) -> None:
    finals = [t.final_response() for t in Trajectories("math_verify", 0).range(0, a.calls + 16)]
    texts = fast_tokenizer().decode_batch(finals, skip_special_tokens=True)  # each call its own text
    for name, spec, kwargs_of in (
        ("no-op function", "benchmarks.verl_loop.levers:noop", lambda i: {"i": i}),
        (
            "math-verify",
            "benchmarks.verl_loop.math_verify_fn:compute_score",
            lambda i: {"data_source": "m", "solution_str": texts[i], "ground_truth": "\\frac{1}{2}"},
        ),
    ):
        rates: dict[str, list[float]] = {}
        for r in range(a.repeat):
            for k, v in (await pools(a.calls, spec, kwargs_of, bare_first=r % 2 == 1)).items():
                rates.setdefault(k, []).append(v)
        ours, bare = (
            statistics.median(rates["ScorerPool calls/s"]),
            statistics.median(rates["ProcessPoolExecutor calls/s"]),
        )
        cpu_ours = statistics.median(rates["ScorerPool process CPU ms/call"])
        cpu_bare = statistics.median(rates["ProcessPoolExecutor process CPU ms/call"])
        print(
            f"scorer processes, {name:15s} ScorerPool {spread(rates['ScorerPool calls/s'])} calls/s, "
            f"ProcessPoolExecutor {spread(rates['ProcessPoolExecutor calls/s'])} calls/s: {ours / bare:.2f}x; "
            f"per-call cost difference {1e6 * (1 / ours - 1 / bare):.0f} us; process CPU per call "
            f"{cpu_ours:.3f} against {cpu_bare:.3f} ms ({cpu_bare / max(cpu_ours, 1e-9):.2f}x the calls per CPU second)"
        )


if __name__ == "__main__":
    asyncio.run(main())
