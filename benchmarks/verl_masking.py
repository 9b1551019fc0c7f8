"""``python -m benchmarks.verl_masking``: what leaving failed samples out costs, masked alone or by group.

Run it from the verl 0.9.1 environment (it calls rewardq's masking estimator's own row decision,
``rewardq.integrations.verl.mask.kept_rows``, which imports verl)::

    PYTHONPATH=. .venv-verl/bin/python -m benchmarks.verl_masking
    PYTHONPATH=. .venv-verl/bin/python -m benchmarks.verl_masking --groups 50000 --sizes 8 16 --rates 0.05

For each failure rate and group size, ``--groups`` GRPO groups get independent failures (seeded), and
three routes decide what trains:

* ``mask``: rewardq's ``verl_on_error=mask`` (``kept_rows``, the same rule as the V1 agent-loop
  worker's :mod:`rewardq.integrations.verl.groups`): every scored sample trains, except the lone
  survivor of a group that failures left with one;
* ``group-drop``: the whole group of a failed sample is thrown away (verl's asynchronous replay buffer
  with a ``failure`` group, or a trainer that drops failed groups);
* ``group-refill``: the same, with the group generated again until the batch is full
  (``ReplayBufferAsync``'s refill): nothing healthy is lost from the batch, but rollouts are spent.

Columns: the share of the step's planned rows (``groups x size``) that train, the share of the healthy
rollouts generated that train, and the rollouts generated per rollout trained (the generation cost of
one trained rollout).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from rewardq.integrations.verl.mask import kept_rows


def measure(rate: float, size: int, groups: int, seed: int) -> dict[str, dict[str, float]]:
    """Every route's figures for ``groups`` groups of ``size`` samples, each failing with ``rate``."""
    rng = np.random.default_rng(seed)
    failed = rng.random((groups, size)) < rate
    scores = torch.from_numpy(np.where(failed, np.nan, 1.0).reshape(-1))
    index = np.repeat(np.arange(groups), size)
    keep = kept_rows(scores, index).numpy().reshape(groups, size)
    healthy = int((~failed).sum())  # of the groups drawn
    generated = groups * size
    clean = ~failed.any(axis=1)  # groups without a failure
    out = {
        "mask": {"trained": int(keep.sum()), "generated": generated},
        "group-drop": {"trained": int(clean.sum()) * size, "generated": generated},
        # refill: every dropped group is generated again until it comes back clean (geometric), so a
        # full batch of `groups` groups costs groups / P(clean) groups on average: measured here as
        # the clean share of the groups drawn above
        "group-refill": {"trained": groups * size, "generated": round(generated / max(clean.mean(), 1e-12))},
    }
    for figures in out.values():
        # healthy rollouts among those generated (the refilled groups have the same healthy share)
        healthy_generated = figures["generated"] * healthy / generated
        figures["healthy_trained"] = figures["trained"] / healthy_generated if healthy_generated else 0.0
        figures["batch"] = figures["trained"] / generated  # of the rows the step planned
        figures["cost"] = figures["generated"] / figures["trained"] if figures["trained"] else float("inf")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.verl_masking", description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=20_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.01, 0.05, 0.10, 0.20])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"{args.groups} groups per row, seed {args.seed}\n")
    print("| failures | group | route | batch rows that train | healthy rollouts that train | generated per trained |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes:
        for rate in args.rates:
            for route, f in measure(rate, size, args.groups, args.seed).items():
                print(
                    f"| {rate:.0%} | {size} | {route} | {f['batch']:.1%} | {f['healthy_trained']:.1%} "
                    f"| {f['cost']:.3f} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
