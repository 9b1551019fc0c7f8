"""The reference reward of every trajectory, computed once before either system runs.

The reference is the scorer verl would apply to the correctly decoded final response
(``tokenizer.decode(final_response_ids, skip_special_tokens=True)``): verl's own
``default_compute_score`` for GSM8K and code, the shared math-verify function for math-verify.
Beside it, the reward verl's multi-output batch gives through its padding arithmetic
(:meth:`~benchmarks.verl_loop.trajectories.Trajectory.verl_valid_length`), so a verl reward
that differs from the reference only because of that bug is counted as such, not as a failure.

The math-verify (and code) references run in a bare ``concurrent.futures.ProcessPoolExecutor``
with one process per core; code references of a full-size run are given by construction instead
(``baseline=False``: verl's ``prime_code`` runs every case in a process of its own, minutes for
hundreds of programs on 2 cores), and the smoke run in tests/verl checks the construction against
what ``prime_code`` computes. For math-verify the pool run is also the baseline the scorer-process
pool is measured against (its wall time, and the CPU the function itself used, summed over the
pool's processes).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from benchmarks.procfs import cpu_seconds
from benchmarks.verl_loop.tokenizer import fast_tokenizer
from benchmarks.verl_loop.trajectories import DATA_SOURCES, Trajectory


@dataclass
class Baseline:
    """A bare ProcessPoolExecutor scoring the same texts with the same function."""

    calls: int
    wall_s: float
    function_cpu_s: float  # CPU of the pool's processes (the scoring function and its IPC)
    processes: int

    @property
    def per_s(self) -> float:
        return self.calls / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class References:
    """``right[i]``: the reference reward of trajectory ``i``; ``verl[i]``: what verl's padding gives."""

    right: dict[int, float] = field(default_factory=dict)
    verl: dict[int, float] = field(default_factory=dict)
    baseline: Baseline | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "right": {str(k): v for k, v in self.right.items()},
            "verl": {str(k): v for k, v in self.verl.items()},
            "baseline": None if self.baseline is None else self.baseline.__dict__,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> References:
        base = d.get("baseline")
        return cls(
            right={int(k): float(v) for k, v in d["right"].items()},
            verl={int(k): float(v) for k, v in d["verl"].items()},
            baseline=Baseline(**base) if base else None,
        )


def _score_one(args: tuple[str, str, str, Any]) -> float:
    scorer, data_source, text, truth = args
    if scorer == "math_verify":
        from benchmarks.verl_loop.math_verify_fn import compute_score

        return float(compute_score(data_source, text, truth))
    from verl.utils.reward_score import default_compute_score

    result = default_compute_score(data_source, text, truth)
    return float(result["score"] if isinstance(result, dict) else result)


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


def compute(scorer: str, trajs: list[Trajectory], *, baseline: bool = False) -> References:
    """References for ``trajs``; with ``baseline`` (math-verify), time the bare pool on them."""
    tok = fast_tokenizer()
    finals = [t.final_response() for t in trajs]
    texts = tok.decode_batch(finals, skip_special_tokens=True)
    cut = {i: t.verl_valid_length() for i, t in enumerate(trajs) if t.verl_valid_length() < len(finals[i])}
    cut_texts = tok.decode_batch([finals[i][:n] for i, n in cut.items()], skip_special_tokens=True)
    source = DATA_SOURCES[scorer]
    jobs = [(scorer, source, text, t.ground_truth) for t, text in zip(trajs, texts)]
    cut_jobs = [(scorer, source, text, trajs[i].ground_truth) for i, text in zip(cut, cut_texts)]
    refs = References()
    if scorer == "gsm8k":
        right = [_score_one(j) for j in jobs]
        wrong = [_score_one(j) for j in cut_jobs]
    elif scorer == "code" and not baseline:
        # by construction (tests/verl's smoke run checks it against verl's prime_code): the right
        # program passes all three cases, the other two of three; only verl's cut texts are run
        right = [1.0 if t.right else 2 / 3 for t in trajs]
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            wrong = list(pool.map(_score_one, cut_jobs))
    else:
        cores = os.cpu_count() or 2
        # the pool's processes are started and warmed up (imports) before the clock starts
        with ProcessPoolExecutor(max_workers=cores) as pool:
            list(pool.map(_score_one, jobs[:cores]))
            pids = list(pool._processes)  # the executor's own processes (no public accessor)
            cpu0, t0 = _cpu(pids), time.perf_counter()
            right = [f.result() for f in [pool.submit(_score_one, j) for j in jobs]]
            wall, cpu = time.perf_counter() - t0, _cpu(pids) - cpu0
            wrong = list(pool.map(_score_one, cut_jobs))
        if baseline:
            refs.baseline = Baseline(len(jobs), wall, cpu, cores)
    for t, r in zip(trajs, right):
        refs.right[t.index] = refs.verl[t.index] = r
    for i, w in zip(cut, wrong):
        refs.verl[trajs[i].index] = w
    return refs
