"""``python -m benchmarks.task_rounds``: what one asyncio task per trajectory costs the event loop.

The worker scores every trajectory in a task of its own (:mod:`rewardq.consumers.scoring_round`):
a slot (a semaphore), a quarantine turn (an async context manager), a timeout scope, one wait for
the batched decode and one for the coalesced commit, each through the coroutine frames between
the task and the future. This times that machinery alone, with no work inside: ``--n``
trajectories as the worker runs them (one task each, futures resolved a read batch at a time),
against the same waits made once per read batch of ``--batch`` trajectories in one task: the most
that scoring a read batch in one task could save. Prints the event loop's CPU (thread time) per
trajectory of each, medians of ``--repeat`` interleaved rounds.

    python -m benchmarks.task_rounds --n 2000 --batch 57 --repeat 7
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

#: Coroutine frames between a trajectory's task and the decode future it waits for (round, try,
#: score, scorer, budget, manager, final-output reader), and the commit future (round, commit, coalescer).
DECODE_DEPTH, COMMIT_DEPTH = 7, 3


async def _wait(futures: list[asyncio.Future[int]], depth: int) -> int:
    if depth:
        return await _wait(futures, depth - 1)
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    futures.append(future)
    return await future


@contextlib.asynccontextmanager
async def _turn() -> AsyncIterator[None]:
    yield


def _scope() -> Any:
    """The scoring budget's timeout scope (``asyncio.timeout``, Python 3.11+; none before)."""
    timeout = getattr(asyncio, "timeout", None)
    return timeout(60) if timeout is not None else contextlib.nullcontext()


async def _trajectory(
    slots: asyncio.Semaphore, decode: list[asyncio.Future[int]], commit: list[asyncio.Future[int]]
) -> None:
    async with slots, _turn():
        async with _scope():
            await _wait(decode, DECODE_DEPTH)
        await _wait(commit, COMMIT_DEPTH)


async def _resolve(futures: list[asyncio.Future[int]]) -> None:
    """One loop turn later, resolve what was asked for (the decode thread's or Redis's answer)."""
    await asyncio.sleep(0)
    batch, futures[:] = list(futures), []
    for f in batch:
        f.set_result(1)


async def per_trajectory(n: int, batch: int, concurrency: int = 32) -> None:
    slots = asyncio.Semaphore(concurrency)
    decode: list[asyncio.Future[int]] = []
    commit: list[asyncio.Future[int]] = []
    for start in range(0, n, batch):
        tasks = [asyncio.create_task(_trajectory(slots, decode, commit)) for _ in range(min(batch, n - start))]
        while not all(t.done() for t in tasks):
            await _resolve(decode)
            await _resolve(commit)


async def per_batch(n: int, batch: int) -> None:
    decode: list[asyncio.Future[int]] = []
    commit: list[asyncio.Future[int]] = []

    async def one_batch() -> None:
        async with _turn():
            async with _scope():
                await _wait(decode, DECODE_DEPTH)
            await _wait(commit, COMMIT_DEPTH)

    for _ in range(0, n, batch):
        task = asyncio.create_task(one_batch())
        while not task.done():
            await _resolve(decode)
            await _resolve(commit)


def _cpu_us_per_trajectory(run: Coroutine[Any, Any, None], n: int) -> float:
    t0 = time.thread_time()
    asyncio.run(run)
    return (time.thread_time() - t0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--batch", type=int, default=57, help="trajectories per read batch (256 entries / 4.5)")
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()
    tasks, batches = [], []
    for _ in range(a.repeat):
        tasks.append(_cpu_us_per_trajectory(per_trajectory(a.n, a.batch), a.n))
        batches.append(_cpu_us_per_trajectory(per_batch(a.n, a.batch), a.n))
    print(
        f"event-loop CPU per trajectory: one task each {statistics.median(tasks):.1f} µs, "
        f"one task per read batch {statistics.median(batches):.1f} µs (medians of {a.repeat})"
    )


if __name__ == "__main__":
    main()
