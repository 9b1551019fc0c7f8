"""Helpers for tests that run workers in-process against the real Redis."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

import numpy as np

from rewardq.config import WorkerConfig
from rewardq.consumers.worker import Worker

FAST = dict(heartbeat_interval=0.2, lease_seconds=2.0, maintenance_interval=0.2, claim_idle=1.0, block_ms=100,
            shutdown_grace=5.0)


def worker_config(ns: str, url: str, **kw: Any) -> WorkerConfig:
    return WorkerConfig(redis_url=url, namespace=ns, **{**FAST, **kw}).validate()


@contextlib.asynccontextmanager
async def running_workers(ns: str, url: str, managers: list, *, name_prefix: str = "w",
                          **kw: Any) -> AsyncIterator[list[Worker]]:
    """Start one in-process worker per manager (named ``w0``, ``w1``, ...); stop them all on exit."""
    workers = [Worker(worker_config(ns, url, name=f"{name_prefix}{i}", **kw), manager=m)
               for i, m in enumerate(managers)]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield workers
    finally:
        for w in workers:
            w.request_stop("test done")
        await asyncio.gather(*tasks)


def output(prompt_len: int, response_len: int, seed: int = 0, **extra: Any) -> dict:
    rng = np.random.default_rng(seed)
    return {"prompt_ids": rng.integers(1, 1000, prompt_len), "response_ids": rng.integers(1, 1000, response_len),
            **extra}


SAMPLE = {"data_source": "test", "reward_model": {"ground_truth": "42"}, "extra_info": {"split": "train"}}
