"""Helpers for tests that run workers in-process against the real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

import numpy as np
from tensordict import TensorDict

from rewardq.config import WorkerConfig
from rewardq.consumers.compose import open_worker, prepare_worker
from rewardq.consumers.metrics import Metrics
from rewardq.consumers.worker import Worker
from rewardq.queue.results import RewardResult
from rewardq.reward.base import RewardManager

FAST: dict[str, Any] = dict(
    heartbeat_interval=0.2,
    lease_seconds=2.0,
    maintenance_interval=0.2,
    claim_idle=1.0,
    block_ms=100,
    shutdown_grace=5.0,
)


#: The ``shutdown_grace`` of a test worker with a ledger (unless the test gives one): a stopping worker
#: writes its spooled trajectories within its grace, and its flusher process (a new interpreter that
#: imports pyarrow) can take longer than FAST's 5 s to start on a loaded CI machine; past the grace the
#: rows are left for the next worker, which a test reading the ledger once its worker stops does not start.
LEDGER_STOP_GRACE = 60.0


def worker_config(ns: str, url: str, **kw: Any) -> WorkerConfig:
    """A quick test worker's settings; it decodes with the demo tokenizer, asked for by name as a worker
    must (there is no default tokenizer), unless ``tokenizer`` says otherwise. A worker with a
    ``ledger`` stops with :data:`LEDGER_STOP_GRACE` unless ``shutdown_grace`` is given."""
    fast = {**FAST, "shutdown_grace": LEDGER_STOP_GRACE} if kw.get("ledger") else FAST
    return WorkerConfig(redis_url=url, namespace=ns, **{"tokenizer": "builtin:demo", **fast, **kw}).validate()


async def open_test_worker(
    cfg: WorkerConfig,
    *,
    manager: RewardManager | None = None,
    tokenizer: Any = None,
    client: Any = None,
    metrics: Metrics | None = None,
) -> Worker:
    """A started in-process worker, put together by the composition root as every worker is
    (:mod:`rewardq.consumers.compose`); ``manager``: one built by the test, else the one ``cfg`` names."""
    worker = await open_worker(
        prepare_worker(cfg, manager=manager, tokenizer=tokenizer), client=client, metrics=metrics
    )
    assert worker is not None, "the worker was stopped while it started"
    return worker


@contextlib.asynccontextmanager
async def running_worker(cfg: WorkerConfig, *, metrics: Metrics | None = None) -> AsyncIterator[Worker]:
    """One in-process worker of ``cfg`` (``metrics``: its metrics hooks), running for the ``with``
    block, then stopped (and waited for)."""
    w = await open_test_worker(cfg, metrics=metrics)
    task = asyncio.create_task(w.run())
    try:
        yield w
    finally:
        w.request_stop("test done")
        await task


@contextlib.asynccontextmanager
async def running_workers(
    ns: str,
    url: str,
    managers: Sequence[RewardManager],
    *,
    name_prefix: str = "w",
    tokenizer: Any = None,
    **kw: Any,
) -> AsyncIterator[list[Worker]]:
    """Start one in-process worker per manager (named ``w0``, ``w1``, ...); stop them all on exit.

    Beside worker processes of one namespace they must declare the same scoring configuration: the
    same ``manager`` spec (the manager objects do not count) and ``tokenizer`` (an object)."""
    opened = await asyncio.gather(
        *(
            open_test_worker(worker_config(ns, url, name=f"{name_prefix}{i}", **kw), manager=m, tokenizer=tokenizer)
            for i, m in enumerate(managers)
        ),
        return_exceptions=True,
    )
    workers = [w for w in opened if isinstance(w, Worker)]
    failed = [e for e in opened if isinstance(e, BaseException)]
    if failed:
        await asyncio.gather(*(w.stop() for w in workers))
        raise failed[0]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield workers
    finally:
        for w in workers:
            w.request_stop("test done")
        await asyncio.gather(*tasks)


async def until(predicate: Callable[[], object], what: str, timeout: float = 10.0, poll: float = 0.05) -> object:
    """Poll ``predicate`` until truthy, letting the event loop run meanwhile; returns its value, or
    fails naming ``what`` after ``timeout`` seconds (the async twin of ``cli_procs.wait_for``)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(poll)
    return value


def results_for(tid: str, n: int, pad: int) -> list[RewardResult]:
    """``n`` ok results of trajectory ``tid``, key ``i`` scoring ``i`` with ``pad`` bytes of extra info."""
    return [
        RewardResult(
            key=f"{tid}_{i}",
            status="ok",
            reward_score=float(i),
            reward_extra_info={"i": i, "pad": "z" * pad},
            worker="w",
            manager="m",
            scored_at=1.0,
            latency_ms=1.0,
        )
        for i in range(n)
    ]


def output(prompt_len: int, response_len: int, seed: int = 0, **extra: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "prompt_ids": rng.integers(1, 1000, prompt_len),
        "response_ids": rng.integers(1, 1000, response_len),
        **extra,
    }


class PeakCounter:
    """Counts the callers inside ``with counter:``; ``peak`` is the most that were ever inside at once."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0

    def __enter__(self) -> PeakCounter:
        self.active += 1
        self.peak = max(self.peak, self.active)
        return self

    def __exit__(self, *exc: object) -> None:
        self.active -= 1


SAMPLE = {"data_source": "test", "reward_model": {"ground_truth": "42"}, "extra_info": {"split": "train"}}


class FlakyJudge(RewardManager):
    """A judge that fails (503) while ``FlakyJudge.broken``, then scores 0.5."""

    broken = True

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        if type(self).broken:
            raise RuntimeError("judge endpoint returned 503")
        return {"reward_score": 0.5, "reward_extra_info": {"judge": "ok"}}


async def fail_a_trajectory_and_a_junk_entry(
    ns: str, url: str, r: Any, client: Any, junk_key: str, *, keep_records: float = 600.0
) -> tuple[list[str], dict[str, RewardResult]]:
    """Given a 3-output trajectory scored by a broken judge (by a worker that keeps the records of
    ended trajectories ``keep_records`` seconds, so it can be retried) and a junk entry: two dead letters.

    Returns ``(keys, first_results)``; the worker has stopped and both dead letters exist.
    """
    from rewardq.queue.keys import Keyspace

    ks = Keyspace(ns)
    keys = client.put_trajectory("flaky", "s", [output(3, 3), output(3, 4), output(3, 5)], SAMPLE)
    r.xadd(ks.stream(0), {"key": junk_key, "data": b"\x93garbage"})
    FlakyJudge.broken = True
    async with running_workers(ns, url, [FlakyJudge(None)], keep_records=keep_records):
        first = await asyncio.to_thread(client.wait_rewards, keys, 10)
        await until(lambda: r.xlen(ks.dead(0)) == 2, "both dead letters", 5.0)
    return keys, first


class Hang(RewardManager):
    """A manager whose scoring never returns (a worker stuck mid-trajectory)."""

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        await asyncio.sleep(3600)
        raise AssertionError("a trajectory stayed in flight for an hour")


async def until_in_flight(w: Worker) -> None:
    """Wait (up to 5 s) until ``w`` is scoring something."""
    await until(lambda: w.in_flight, f"worker {w.name} to take a trajectory", 5.0)


async def stop_while_scoring(cfg: WorkerConfig) -> None:
    """Run a worker on ``cfg`` whose manager never returns, and stop it (as SIGTERM does) once it
    is scoring a trajectory; returns when it has stopped (handing the trajectory back)."""
    w = await open_test_worker(cfg, manager=Hang(None))
    task = asyncio.create_task(w.run())
    await until_in_flight(w)
    w.request_stop("test")
    await task


async def abandon_worker(w: Any) -> None:
    """Simulate SIGKILL: the worker's tasks vanish without releasing, acking or unregistering."""
    for f in list(w.in_flight.values()):
        f.task.cancel()
    for t in w._tasks:
        t.cancel()
    await asyncio.gather(*(f.task for f in w.in_flight.values()), *w._tasks, return_exceptions=True)
    await w._client.aclose()


async def seconds_to_use_a_hand_back(giver: Any, waiter: Any) -> float:
    """How long ``waiter`` (a rate limiter of ``max_tpm=600``: a bucket of 10 tokens refilled at
    10/s) waits for 10 tokens once ``giver`` (the same limiter, or another process's) reserved 50 (the
    level goes to -40: the refill alone would take 5 s) and, 0.2 s into the wait, hands them back
    (its call was cancelled). Checks the 5 s first."""
    assert await giver.acquire_tokens(50) == 0.0
    refill = await waiter.try_tokens(10)
    assert abs(refill - 5.0) < 0.3, refill
    t0 = time.monotonic()
    waiting = asyncio.create_task(waiter.acquire_tokens(10))
    await asyncio.sleep(0.2)
    await giver.charge_tokens(-50)
    await waiting
    return time.monotonic() - t0


def count_reads(client: Any, monkeypatch: Any) -> list[list[str]]:
    """The keys of every ``get_rewards`` call an ``AsyncRewardClient`` makes from now on (the list
    fills as it reads; ``monkeypatch``: pytest's, which puts the method back)."""
    reads: list[list[str]] = []
    real = client.get_rewards

    async def counting(keys: Iterable[str]) -> dict[str, RewardResult | None]:
        keys = list(keys)
        reads.append(keys)
        result: dict[str, RewardResult | None] = await real(keys)
        return result

    monkeypatch.setattr(client, "get_rewards", counting)
    return reads


def top_snapshot() -> dict[str, Any]:
    """A quiet ``rewardq top`` snapshot (rewardq.ops.top.TopModel.refresh's shape)."""
    return {
        "namespace": "ns",
        "redis_url": "redis://x",
        "time": 0.0,
        "trajectories_per_s": 0,
        "errors_per_s": 0,
        "history_s": 60,
        "scored_per_second": [0],
        "errors_per_second": [0],
        "backlog": {"entries": 0, "exact": True, "seconds": 0.0, "outputs_per_s": 0},
        "waiting_total": 0,
        "dead_letters": 0,
        "workers": [],
        "sources": [],
        "oldest_waiting": None,
        "retrying": {"n": 0, "waiting": []},
        "failures": {},
    }
