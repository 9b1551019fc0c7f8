"""Settings of a worker *process*: things only the process's owner should change.

A :class:`~rewardq.consumers.worker.Worker` embedded in someone else's process (a test, the
embedded demo) leaves the interpreter alone except for torch's intra-op thread count;
``rewardq worker`` also freezes the start-up heap.
"""

from __future__ import annotations

import gc
import os


def freeze_startup_heap() -> None:
    """Move every object alive after start-up into the garbage collector's permanent generation.

    torch, tensordict and the tokenizer leave ~310,000 tracked objects behind, none of which
    ever becomes garbage, and a full collection walks all of them: 120 ms on the benchmark
    machine, one every few thousand trajectories, a stall that lands in some trajectory's
    latency. After ``gc.freeze()`` collections see only objects created later (0 full
    collections and ~1.5 % less worker CPU in a 6,000-trajectory drain, docs/performance.md).
    For the owner of the process only (``rewardq worker``, the benchmark's runner): it
    affects every object of the interpreter, not just the worker's.
    """
    gc.collect()
    gc.freeze()


def limit_torch_threads() -> None:
    """One intra-op thread: a trajectory batch is a few thousand ids, too small to split.

    With torch's default (one thread per core) small ops wake the OpenMP pool, whose threads
    spin: docs/performance.md measured 7.0 ms of worker CPU per trajectory with 2 threads,
    3.1 ms with 1, on 2 cores. An explicit ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` wins.
    """
    if "OMP_NUM_THREADS" in os.environ or "MKL_NUM_THREADS" in os.environ:
        return
    import torch

    if torch.get_num_threads() > 1:
        torch.set_num_threads(1)
