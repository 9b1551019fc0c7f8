"""Fault injection with real worker processes and a throwaway redis-server.

At-least-once delivery, exactly-once effect: a worker SIGKILLed at any point (while
reading, while scoring, between write-back and acknowledgement, right after the commit)
loses nothing; a Redis crash with AOF on loses nothing; dropped connections are survived.
After each fault, every key of every trajectory has exactly one result with the value the
manager gives it, every trajectory finished once, and the stream is empty.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from rewardq import AsyncRewardClient, RewardClient
from rewardq.config import WorkerConfig
from rewardq.consumers.compose import prepare_worker, run_worker
from rewardq.queue.keys import Keyspace
from rewardq.queue.script_runner import Call
from tests.support.cli_procs import START_WAIT
from tests.support.exactly_once import Trajectory, make_trajectories, push, settle
from tests.support.helpers import open_test_worker
from tests.support.managers import EchoManager
from tests.support.proc_worker import WorkerProcess
from tests.support.redis_server import RedisServer
from tests.support.sync_client import SyncClient, connect

ECHO = "tests.support.managers:EchoManager"
#: Fast recovery: a dead worker's entries are reclaimed ~2 s after its last lease renewal.
FAST: dict[str, Any] = dict(
    manager=ECHO,
    heartbeat_interval=0.3,
    lease_seconds=1.5,
    claim_idle=2.0,
    maintenance_interval=0.3,
    block_ms=200,
    shutdown_grace=5,
    max_deliveries=20,
)
START_TIMEOUT = START_WAIT


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as srv:
        yield srv


def _ns(tag: str) -> str:
    return f"f-{tag}-{uuid.uuid4().hex[:6]}"


def _started(*workers: WorkerProcess) -> None:
    for w in workers:
        assert w.wait_for_log(f"worker {w.name} started", START_TIMEOUT), f"{w.name} did not start:\n{w.log()}"


def _wait(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _pending_by_consumer(r: SyncClient, ks: Keyspace) -> dict[str, int]:
    info = r.xpending(ks.stream(0), ks.group)
    return {c["name"].decode(): int(c["pending"]) for c in info.get("consumers") or []}


def test_sigkill_at_every_phase_loses_nothing(server: RedisServer, tmp_path: Path) -> None:
    # Given one doomed worker per phase, each in its own namespace
    phases = {
        "scoring": None,
        "reading": "kill-after-read",
        "before-ack": "kill-before-commit",
        "after-commit": "kill-after-commit",
    }
    marks = tmp_path / "marks"
    marks.mkdir()
    names = {p: _ns(p) for p in phases}
    # (concurrency 1: one trajectory in flight, so each fault fires at a known point even on a busy machine)
    doomed = {
        p: WorkerProcess(
            server.url,
            names[p],
            fault=fault,
            log_dir=tmp_path,
            name=f"doomed-{p}",
            manager_options={"sleep": 3600, "mark_dir": str(marks)} if p == "scoring" else {},
            concurrency=1,
            **FAST,
        )
        for p, fault in phases.items()
    }
    r = server.client()
    try:
        _started(*doomed.values())
        jobs = {p: make_trajectories(6, seed=i, max_outputs=4, prefix=p) for i, p in enumerate(phases)}
        clients = {p: RewardClient.from_url(server.url, namespace=names[p]) for p in phases}
        keys = {p: push(clients[p], jobs[p]) for p in phases}
        ks = {p: Keyspace(names[p]) for p in phases}

        # When each dies at its point
        _wait(lambda: any(marks.iterdir()), 60, "the sleepy manager to start scoring")
        doomed["scoring"].kill()
        for p in ("reading", "before-ack", "after-commit"):
            assert doomed[p].wait(60) == -9, f"{p}: the fault did not fire:\n{doomed[p].log()}"
            assert "FAULT" in doomed[p].log()

        # (evidence that each died where intended)
        assert _pending_by_consumer(r, ks["scoring"]).get("doomed-scoring", 0) > 0
        assert r.xlen(ks["scoring"].done(0)) == 0
        assert _pending_by_consumer(r, ks["reading"]).get("doomed-reading", 0) > 0
        assert not r.keys(ks["reading"].traj_prefix(0) + "*"), "kill-after-read stored nothing"
        kb = ks["before-ack"]
        half_done = [
            k
            for k in keys["before-ack"]
            if r.exists(kb.reward_key(k)) and r.hget(kb.traj_key(k.rpartition("_")[0]), "state") != b"done"
        ]
        assert half_done, "kill-before-commit left results written but unacknowledged"
        assert _pending_by_consumer(r, kb).get("doomed-before-ack", 0) > 0
        # (other trajectories' commits may have been in flight on other connections at the kill)
        assert 1 <= r.xlen(ks["after-commit"].done(0)) < len(jobs["after-commit"])

        # Then a live worker per namespace (in this process: only the doomed need to be
        # processes) reclaims, and every key ends with exactly one result
        asyncio.run(_rescue(server.url, names, clients, keys))
        for p in phases:
            expected = {k: v for t in jobs[p] for k, v in t.expected.items()}
            verdict = settle(r, ks[p], expected)
            assert verdict.clean, f"{p}: {verdict.explain()}"
            assert verdict.leftovers == {"stream": 0, "pending": 0, "waiting": 0, "dead": 0}, p
            res = clients[p].get_rewards(keys[p])
            assert all(x is not None for x in res.values()), p
            workers = {x.worker for x in res.values() if x is not None}
            if p in ("scoring", "reading"):
                assert workers == {f"rescuer-{p}"}, (p, workers)
            elif p == "before-ack":  # the unacknowledged write-back was redone by the real commit
                assert {x.worker for k in half_done if (x := res[k]) is not None} == {"rescuer-before-ack"}
            else:  # the committed trajectory kept the dead worker's result; the rest were rescued
                assert "doomed-after-commit" in workers and "rescuer-after-commit" in workers
            clients[p].close()
    finally:
        for w in doomed.values():
            w.kill()
        r.close()


async def _rescue(
    url: str, names: dict[str, str], clients: dict[str, RewardClient], keys: dict[str, list[str]]
) -> None:
    settings: dict[str, Any] = {k: v for k, v in FAST.items() if k != "manager"}
    stop = asyncio.Event()
    tasks = [  # each waits at the fleet gate until the dead workers' heartbeats lapse, then serves
        asyncio.create_task(
            run_worker(
                # another scoring configuration than the dead workers': it takes over once their heartbeats lapse
                prepare_worker(
                    WorkerConfig(
                        redis_url=url, namespace=names[p], name=f"rescuer-{p}", takeover=True, **settings
                    ).validate(),
                    manager=EchoManager(),
                ),
                stopping=stop,
            )
        )
        for p in names
    ]
    try:
        for p in names:
            await asyncio.to_thread(clients[p].wait_rewards, keys[p], 90)
        # results can be readable before the trajectory is finished (kill-before-commit wrote
        # them, acknowledging nothing): wait until the rescuers have acknowledged everything too
        r = connect(url)
        try:
            deadline = time.monotonic() + 90
            while any(_pending_by_consumer(r, Keyspace(ns)) for ns in names.values()):
                assert time.monotonic() < deadline, "the rescuers left entries unacknowledged"
                await asyncio.sleep(0.1)
        finally:
            r.close()
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def _produce(
    client: RewardClient, jobs: list[Trajectory], keys: list[str], errors: list[BaseException], pause: float
) -> None:
    try:
        for t in jobs:
            keys += client.put_trajectory(
                t.uid, t.session_id, t.outputs, {"data_source": "test", "reward_model": {"ground_truth": "1"}}
            )
            time.sleep(pause)
    except BaseException as exc:  # noqa: BLE001 - the test asserts there were none
        errors.append(exc)


def _produce_async(
    url: str, ns: str, jobs: list[Trajectory], keys: list[str], errors: list[BaseException], pause: float
) -> None:
    """The asyncio client's flavour of :func:`_produce`, ending with its own wait_rewards."""

    async def go() -> None:
        async with AsyncRewardClient.from_url(url, namespace=ns) as client:
            for t in jobs:
                keys.extend(await client.put_trajectory(t.uid, t.session_id, t.outputs))
                await asyncio.sleep(pause)
            await client.wait_rewards(keys, timeout=90)

    try:
        asyncio.run(go())
    except BaseException as exc:  # noqa: BLE001 - the test asserts there were none
        errors.append(exc)


def test_redis_crash_mid_run_with_aof_loses_nothing(server: RedisServer, tmp_path: Path) -> None:
    # Given two workers scoring a stream of trajectories on an AOF (appendfsync always) server
    ns = _ns("crash")
    workers = [
        WorkerProcess(
            server.url,
            ns,
            log_dir=tmp_path,
            name=f"w{i}",
            manager_options={"sleep": 0.02, "jitter": 0.05},
            concurrency=8,
            **FAST,
        )
        for i in range(2)
    ]
    r = None
    try:
        _started(*workers)
        pids = [w.pid for w in workers]
        jobs = make_trajectories(150, seed=7, max_outputs=6)
        client = RewardClient.from_url(server.url, namespace=ns)
        keys: list[str] = []
        errors: list[BaseException] = []
        ajobs = make_trajectories(60, seed=8, max_outputs=6, prefix="a")
        akeys: list[str] = []
        producers = [
            threading.Thread(target=_produce, args=(client, jobs, keys, errors, 0.02)),
            threading.Thread(target=_produce_async, args=(server.url, ns, ajobs, akeys, errors, 0.05)),
        ]
        for t in producers:
            t.start()
        # When Redis crashes (SIGKILL) a third of the way in and is back a second later
        _wait(lambda: len(keys) > 150 and client.get_reward(keys[0]) is not None, 60, "the first results")
        server.restart(kill=True, down_for=1.0)
        for t in producers:
            t.join(120)
        assert not any(t.is_alive() for t in producers) and not errors, f"a producer failed: {errors!r}"
        # Then producers (sync and asyncio) and workers carried on, and nothing was lost or done twice
        client.wait_rewards(keys, timeout=90)
        r = server.client()
        verdict = settle(r, Keyspace(ns), {k: v for t in jobs + ajobs for k, v in t.expected.items()})
        assert verdict.clean, verdict.explain()
        assert verdict.leftovers == {"stream": 0, "pending": 0, "waiting": 0, "dead": 0}
        assert [w.pid for w in workers if w.alive()] == pids, "a worker died with the Redis restart"
        assert "append only file" in server.log_tail(200).lower()  # the data came back from the AOF
        client.close()
        for w in workers:
            assert w.terminate() == 0, w.log()
    finally:
        for w in workers:
            w.kill()
        if r is not None:
            r.close()


def test_dropped_connections_worker_carries_on(server: RedisServer, tmp_path: Path) -> None:
    # Given a worker and a producer, and an admin killing every client connection repeatedly
    ns = _ns("drop")
    worker = WorkerProcess(
        server.url, ns, log_dir=tmp_path, name="survivor", manager_options={"sleep": 0.02}, concurrency=8, **FAST
    )
    admin = server.client()
    stop = threading.Event()
    killed = []

    def killer() -> None:
        while not stop.wait(0.25):
            try:
                killed.append(int(admin.execute_command("CLIENT", "KILL", "TYPE", "normal")))
            except redis.RedisError:
                pass

    try:
        _started(worker)
        jobs = make_trajectories(80, seed=11, max_outputs=5)
        client = RewardClient.from_url(server.url, namespace=ns)
        keys: list[str] = []
        errors: list[BaseException] = []
        t = threading.Thread(target=killer)
        t.start()
        try:
            _produce(client, jobs, keys, errors, 0.03)
            time.sleep(1.0)
        finally:
            stop.set()
            t.join()
        assert not errors, f"the producer failed: {errors!r}"
        assert sum(killed) > 5, f"CLIENT KILL killed only {killed}"
        # Then the worker reconnected and finished everything, exactly once
        client.wait_rewards(keys, timeout=90)
        verdict = settle(admin, Keyspace(ns), {k: v for j in jobs for k, v in j.expected.items()})
        assert verdict.clean, verdict.explain()
        assert verdict.leftovers == {"stream": 0, "pending": 0, "waiting": 0, "dead": 0}
        assert worker.alive(), worker.log()
        client.close()
        assert worker.terminate() == 0, worker.log()
    finally:
        worker.kill()
        admin.close()


async def test_store_and_claim_survive_script_cache_loss(server: RedisServer) -> None:
    """A fresh or restarted Redis has no scripts: the pipelined EVALSHAs answer NOSCRIPT; the
    broker loads the script and runs those calls again instead of failing the read."""
    from rewardq.queue.codec import decode_output

    ns = _ns("noscript")
    client = RewardClient.from_url(server.url, namespace=ns)
    jobs = make_trajectories(6, seed=5)
    push(client, jobs)
    w = await open_test_worker(WorkerConfig(redis_url=server.url, namespace=ns, name="ns-w"), manager=EchoManager())
    broker = w.broker
    try:
        real = broker.scripts._pipeline
        loads: list[bool] = []

        async def counting(script: Any, calls: Sequence[Call], *, load: bool = False) -> list[Any]:
            loads.append(load)
            return await real(script, calls, load=load)

        broker.scripts._pipeline = counting  # type: ignore[method-assign]  # counts the calls it passes on
        entries = await broker.read([0], 100, None)
        by_tid: dict[str, Any] = {}
        for e in entries:
            by_tid.setdefault(decode_output(e.data).tid, []).append(e)
        first, rest = list(by_tid)[:2], list(by_tid)[2:]
        # Given Redis forgot every script, when two trajectories are claimed whole
        assert await broker.r.script_flush() is True
        claimed = await broker.claim_whole([(0, tid, by_tid[tid]) for tid in first])
        assert claimed == [True, True] and loads == [False, True]
        # and when the others are stored output by output after another loss
        assert await broker.r.script_flush() is True
        loads.clear()
        todo = [e for tid in rest for e in by_tid[tid]]
        outcomes = await broker.store([(e, decode_output(e.data), bytes(e.data)) for e in todo])
        assert loads == [False, True], "the script cache was not lost: the test did not test anything"
        assert len(outcomes) == len(todo) and {o.kind for o in outcomes} <= {"parked", "complete"}
        assert sum(o.kind == "complete" for o in outcomes) == len(rest)
    finally:
        await w.stop()
        client.close()


def test_verdict_counts_lost_duplicated_and_errors(ns: str, sync_redis: SyncClient) -> None:
    """The checker itself can fail: a missing result, a second finish, a wrong value, an error."""
    from rewardq.queue.results import RewardResult

    ks = Keyspace(ns)
    expected = {"a_s_0": 1.0, "a_s_1": 1.0, "b_s_0": 2.0, "c_s_0": 3.0, "d_s_0": 4.0, "e_s_0": 5.0}
    for key, value in expected.items():
        if key in ("a_s_1",):
            continue  # lost: no result
        status, score = ("error", None) if key == "d_s_0" else ("ok", 9.0 if key == "c_s_0" else value)
        h = RewardResult(key=key, status=status, reward_score=score, error="boom" if score is None else None)
        sync_redis.hset(ks.reward_key(key), mapping={field: v for field, v in h.to_hash().items()})
    for tid in ("a_s", "b_s", "b_s", "c_s", "d_s"):  # b finished twice; e never finished
        sync_redis.xadd(ks.done(0), {"tid": tid, "n": 1, "status": "ok"})
    v = settle(sync_redis, ks, expected, timeout=0)
    assert (v.trajectories, v.keys) == (5, 6)
    assert v.missing == ["a_s_1"] and v.unfinished == ["e_s"] and v.lost == 2
    assert v.wrong == ["c_s_0"] and v.duplicated == 2  # b twice, c's value
    assert v.errors == 1 and not v.clean
