"""User code never blocks, kills or stops the worker: real ``rewardq worker`` processes.

Only the offending trajectory ends in error, with a reason that names what it did; its
neighbours are scored normally and on time. Reward functions and the manager that misbehave
on request are in ``tests/support/misbehaving.py``: the response text says what to do.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rewardq.producers.client import RewardClient
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RewardResult
from tests.conftest import _delete_namespace
from tests.support.checks import must
from tests.support.cli_procs import START_WAIT, Procs, wait_for, worker_argv
from tests.support.isolation import MISBEHAVING, alive
from tests.support.proc_worker import WorkerProcess
from tests.support.records import text_output
from tests.support.sync_client import connect

pytestmark = pytest.mark.slow

MANAGER = "tests.support.misbehaving:MisbehavingManager"
START_TIMEOUT = START_WAIT
SCORE_TIMEOUT = 8.0


def push(client: RewardClient, text: str, *, ground_truth: str = "ok") -> str:
    """One single-output trajectory whose response is ``text``; returns its key."""
    sample = {"data_source": "test", "reward_model": {"ground_truth": ground_truth}}
    (key,) = client.put_trajectory(f"u-{uuid.uuid4().hex[:10]}", "0", [text_output(text, "What now?")], sample)
    return key


def marked_pids(marks: Path, verb: str) -> list[int]:
    return [int(p.name.split("-")[1]) for p in marks.iterdir() if p.name.startswith(verb + "-")]


@pytest.fixture(scope="module")
def sync_fn_worker(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, RewardClient, Path]]:
    """One ``rewardq worker`` (naive manager) whose sync ``--reward-fn`` misbehaves on request,
    with two scorer processes (and up to four spares) and an 8 s score timeout; shared by the
    tests of this group."""
    ns = f"iso-{uuid.uuid4().hex[:8]}"
    marks = tmp_path_factory.mktemp("marks")
    worker = WorkerProcess(
        redis_url,
        ns,
        cli=True,
        log_dir=tmp_path_factory.mktemp("logs"),
        env={"MISBEHAVING_MARKS": str(marks)},
        manager="naive",
        tokenizer="builtin:demo",
        reward_fn=f"{MISBEHAVING}:misbehave",
        scorer_processes=2,
        scorer_spares=4,
        score_timeout=SCORE_TIMEOUT,
        shutdown_grace=3,
    )
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        assert worker.wait_for_log(f"worker {worker.name} started", START_TIMEOUT), worker.log()
        yield worker, client, marks
    finally:
        client.close()
        worker.terminate(30)
        _delete_namespace(redis_url, ns)


def latencies(results: dict[str, RewardResult]) -> list[float]:
    return sorted(must(r.latency_ms) for r in results.values())


def test_more_hung_calls_than_scorer_processes_never_delay_good_trajectories(
    sync_fn_worker: tuple[WorkerProcess, RewardClient, Path],
) -> None:
    worker, client, marks = sync_fn_worker
    baseline = latencies(client.wait_rewards([push(client, "ok") for _ in range(10)], timeout=30))
    # Given five calls that hang, more than the two scorer processes (fewer than those and the
    # four spares), pushed first
    hung = [push(client, "hang") for _ in range(5)]
    wait_for(lambda: len(marked_pids(marks, "hang")) >= 2, 120, "the first hung calls to start")
    # When good trajectories arrive behind them
    good = [push(client, "ok") for _ in range(10)]
    results = client.wait_rewards(good, timeout=SCORE_TIMEOUT + 30)
    # Then each is scored correctly, and before any hung call reached its timeout
    assert {k: (r.status, r.reward_score) for k, r in results.items()} == {k: ("ok", 1.0) for k in good}
    assert client.get_rewards(hung) == {k: None for k in hung}, latencies(results)
    # And each hung trajectory ends in error at its timeout, its process killed
    ended = client.wait_rewards(hung, timeout=SCORE_TIMEOUT * 3 + 30)
    assert {r.status for r in ended.values()} == {"error"}
    assert {(r.error, r.failure_kind) for r in ended.values()} == {
        (f"scoring failed: ScoringTimeout: scoring timed out after {SCORE_TIMEOUT:g}s (score_timeout)", "timeout")
    }
    hung_pids = marked_pids(marks, "hang")
    wait_for(lambda: not any(alive(p) for p in hung_pids), 15, "the hung scorer processes to be killed")
    assert "starting spare process" in worker.log()
    # And trajectories after the hangs are scored in their normal time: their median latency is
    # within a few times the one measured before the hangs
    later = latencies(client.wait_rewards([push(client, "ok") for _ in range(10)], timeout=30))
    print(f"\nlatencies (ms): before the hangs {baseline}, behind them {latencies(results)}, after {later}")
    assert later[len(later) // 2] <= 5 * baseline[len(baseline) // 2], (baseline, later)


def test_exits_interrupts_and_crashes_end_only_their_own_trajectory(
    sync_fn_worker: tuple[WorkerProcess, RewardClient, Path],
) -> None:
    worker, client, _ = sync_fn_worker
    reasons = {
        "sysexit:3": r"the reward function called sys.exit(3)",
        "interrupt": r"the reward function raised KeyboardInterrupt",
        "exit:7": r"exited with code 7 while scoring (os._exit, or a fatal error in native code?)",
        "segfault": r"killed by SIGSEGV while scoring (a crash in native code)",
    }
    # Given each misbehaviour, with good trajectories pushed in between
    bad, good = {}, []
    for text in reasons:
        bad[text] = push(client, text)
        good += [push(client, "ok"), push(client, "no", ground_truth="yes")]
    results = client.wait_rewards([*bad.values(), *good], timeout=60)
    # Then every misbehaving trajectory has an error result naming what its function did
    for text, reason in reasons.items():
        r = results[bad[text]]
        assert r.status == "error" and (r.error or "").startswith("scoring failed: ScoringError: "), (text, r.error)
        assert reason in (r.error or ""), (text, r.error)
        assert r.failure_kind == "scorer", (text, r.failure_kind)
    # And its neighbours were scored normally, by a worker that is still running
    assert [(results[k].status, results[k].reward_score) for k in good] == [("ok", 1.0), ("ok", 0.0)] * 4
    assert worker.alive()
    assert client.wait_rewards([push(client, "ok")], timeout=30).popitem()[1].reward_score == 1.0


def test_a_function_holding_the_gil_does_not_time_out_its_neighbours(
    sync_fn_worker: tuple[WorkerProcess, RewardClient, Path],
) -> None:
    _, client, _ = sync_fn_worker
    # Given a call that holds the GIL for 6 s (in a thread of the worker, it froze the event
    # loop, so its neighbours' timeouts fired: "scoring timed out")
    holder = push(client, "gil:6")
    time.sleep(0.5)
    # When good trajectories come in meanwhile
    good = [push(client, "ok") for _ in range(6)]
    results = client.wait_rewards(good, timeout=30)
    # Then they are scored before the holder lets go, and the holder finishes too
    assert {(r.status, r.reward_score) for r in results.values()} == {("ok", 1.0)}
    assert client.get_rewards([holder]) == {holder: None}, latencies(results)
    held = client.wait_rewards([holder], timeout=30)[holder]
    assert (held.status, held.reward_score) == ("ok", 0.0) and must(held.latency_ms) >= 6000


def test_a_superseded_worker_whose_exit_is_forced_still_exits_2(redis_url: str, ns: str, tmp_path: Path) -> None:
    # Given a worker whose manager left a hung thread in asyncio's default executor, so that the
    # process cannot end by itself once the worker stops (its exit is forced after EXIT_AFTER_STOP)
    worker = WorkerProcess(
        redis_url,
        ns,
        cli=True,
        log_dir=tmp_path,
        manager=MANAGER,
        manager_options={"delay": 0.0},
        shutdown_grace=1.0,
        heartbeat_interval=0.5,
    )
    client = RewardClient.from_url(redis_url, namespace=ns)
    r = connect(redis_url)
    try:
        assert worker.wait_for_log(f"worker {worker.name} started", START_TIMEOUT), worker.log()
        push(client, "thread-hang")
        ks = Keyspace(ns)
        wait_for(lambda: r.xpending(ks.stream(0), "rewardq-workers")["pending"] == 1, 60, "the trajectory in flight")
        # When a takeover replaces the namespace's scoring record behind its back
        r.hset(ks.meta, "scoring", json.dumps({"digest": "0" * 16, "config": "manager=dapo (new)"}))
        # Then it stops as superseded, and the forced exit keeps the exit code a supervisor reads: 2
        rc = worker.proc.wait(60)
        log = worker.log()
        assert "superseded" in log and "exiting now with code 2" in log, log
        assert rc == 2, log
    finally:
        r.close()
        client.close()
        worker.kill()


def test_sigterm_ends_the_worker_within_grace_plus_5s_despite_hung_threads_and_children(
    redis_url: str, ns: str, tmp_path: Path
) -> None:
    # Given a worker whose manager left a hung thread in asyncio's default executor, and whose
    # reward function hangs in a scorer process that ignores SIGTERM
    marks = tmp_path / "marks"
    marks.mkdir()
    grace = 2.0
    worker = WorkerProcess(
        redis_url,
        ns,
        cli=True,
        log_dir=tmp_path,
        env={"MISBEHAVING_MARKS": str(marks)},
        manager=MANAGER,
        manager_options={"delay": 0.0},
        tokenizer="builtin:demo",
        reward_fn=f"{MISBEHAVING}:misbehave",
        scorer_processes=1,
        shutdown_grace=grace,
    )
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        assert worker.wait_for_log(f"worker {worker.name} started", START_TIMEOUT), worker.log()
        keys = [push(client, "thread-hang"), push(client, "fn:stubborn")]
        wait_for(lambda: marked_pids(marks, "stubborn"), 120, "the stubborn call to start")
        (stubborn,) = marked_pids(marks, "stubborn")
        time.sleep(0.5)
        # When it is sent SIGTERM
        t0 = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        rc = worker.proc.wait(grace + 30)
        took = time.monotonic() - t0
        # Then the process is gone within shutdown_grace + 5 s, having handed its work back
        assert took < grace + 5.0, f"{took:.1f}s\n{worker.log()}"
        assert rc == 0, worker.log()
        log = worker.log()
        assert f"worker {worker.name} stopped" in log and "handed back 2 unfinished trajectories" in log
        assert "exiting now with code 0" in log  # only the hung thread was left; the worker had stopped
        # And the stubborn scorer process went with it
        wait_for(lambda: not alive(stubborn), 5, "the stubborn scorer process to be gone")
        assert client.get_rewards(keys) == {k: None for k in keys}  # handed back, not failed
    finally:
        client.close()
        worker.kill()


@pytest.mark.timeout(900)  # the culprit takes its worker down twice: each restart pays a worker's start
def test_a_crashing_manager_is_blamed_alone_and_its_batch_mates_are_scored(
    procs: Procs, redis_url: str, ns: str
) -> None:
    # Given two worker processes under the supervisor, with a custom manager that runs in
    # the worker's own process and an async reward function it calls
    sup = procs.start(
        worker_argv(
            redis_url,
            ns,
            "crash",
            "--processes",
            "2",
            "--reward-fn",
            f"{MISBEHAVING}:misbehave_async",
            "--claim-idle",
            "3",
            manager=MANAGER,
        ),
        env={
            "REWARDQ_LEASE_SECONDS": "2.5",
            "REWARDQ_HEARTBEAT_INTERVAL": "0.5",
            "REWARDQ_MAINTENANCE_INTERVAL": "0.5",
            "REWARDQ_SHUTDOWN_GRACE": "3",
        },
        tag="sup",
    )
    wait_for(lambda: sup.stderr().count("started: redis=") >= 2, START_TIMEOUT, "both workers to start", procs=[sup])
    client = RewardClient.from_url(redis_url, namespace=ns)
    # When one trajectory's run_single calls os._exit, pushed with neighbours that all are
    # in flight at that moment (each waits 0.5 s first), some of which exit or interrupt
    # in-process (the manager itself, and an async reward function)
    culprit = push(client, "exit:9")
    reasons = {
        push(client, "sysexit:5"): "the reward manager's run_single called sys.exit(5)",
        push(client, "interrupt"): "the reward manager's run_single raised KeyboardInterrupt",
        push(client, "fn:sysexit:4"): "the reward function called sys.exit(4)",
        push(client, "fn:interrupt"): "the reward function raised KeyboardInterrupt",
    }
    good = [push(client, "ok") for _ in range(8)] + [push(client, "fn:ok")]
    # (two worker restarts, each paying the torch import: over 70 s each on a loaded machine)
    results = client.wait_rewards([culprit, *reasons, *good], timeout=2 * START_TIMEOUT + 240)
    # Then only the culprit ends in error, blamed for the deaths of its worker process
    r = results[culprit]
    assert r.status == "error", r
    assert "the worker process scoring this trajectory died 2 time(s) while it was scored alone" in (r.error or "")
    assert r.failure_kind == "transient"  # its workers died: nothing says the trajectory itself is wrong
    # And the in-process exits and interrupts are errors naming them, not shutdowns
    for key, reason in reasons.items():
        assert results[key].status == "error" and results[key].error == f"scoring failed: ScoringError: {reason}"
    # And every neighbour was scored normally
    assert {k: (results[k].status, results[k].reward_score) for k in good} == {k: ("ok", 1.0) for k in good}
    ks = Keyspace(ns)
    dead = [f for _, f in client.r.xrange(ks.dead(0))]
    assert sorted(f[b"kind"] for f in dead) == [b"crashed"] + [b"scoring"] * 4
    assert "died with code 9" in sup.stderr()  # the supervisor restarted the worker it took down
    client.close()
    assert sup.terminate(60) in (0, 1)
