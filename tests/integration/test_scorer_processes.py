"""Scorer processes under a real ``rewardq worker``: hung neighbours never time out good calls, and
what one call does to its process (its cwd, environment, signal handlers, children, output) never
reaches the next call, the worker or its log.

The reward function misbehaves on request (``tests/support/misbehaving.py``): the response text
says what to do.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewardq.producers.client import RewardClient
from tests.conftest import _delete_namespace
from tests.support.checks import must
from tests.support.cli_procs import START_WAIT, wait_for
from tests.support.isolation import MISBEHAVING, alive
from tests.support.proc_worker import WorkerProcess
from tests.support.records import text_output

pytestmark = pytest.mark.slow

START_TIMEOUT = START_WAIT


def push(client: RewardClient, text: str, *, ground_truth: str = "ok") -> str:
    """One single-output trajectory whose response is ``text``; returns its key."""
    sample = {"data_source": "test", "reward_model": {"ground_truth": ground_truth}}
    (key,) = client.put_trajectory(f"u-{uuid.uuid4().hex[:10]}", "0", [text_output(text, "What now?")], sample)
    return key


def marked(marks: Path, verb: str) -> list[Path]:
    return [p for p in marks.iterdir() if p.name.startswith(verb + "-")]


def parent_of(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return int(raw[raw.rfind(b")") + 2 :].split()[1])


def start_worker(redis_url: str, ns: str, log_dir: Path, marks: Path, **settings: Any) -> WorkerProcess:
    worker = WorkerProcess(
        redis_url,
        ns,
        cli=True,
        log_dir=log_dir,
        env={"MISBEHAVING_MARKS": str(marks)},
        manager="naive",
        tokenizer="builtin:demo",
        reward_fn=f"{MISBEHAVING}:misbehave",
        shutdown_grace=3,
        **settings,
    )
    assert worker.wait_for_log(f"worker {worker.name} started", START_TIMEOUT), worker.log()
    return worker


def test_six_hung_calls_beside_three_good_ones_leave_the_good_ones_ok(redis_url: str, ns: str, tmp_path: Path) -> None:
    # Given a worker with two scorer processes (this machine's cores) and --score-timeout 2
    marks = tmp_path / "marks"
    marks.mkdir()
    worker = start_worker(redis_url, ns, tmp_path, marks, scorer_processes=2, score_timeout=2.0)
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        # When six calls that hang are in flight first, both processes taken by them
        hung = [push(client, "hang") for _ in range(6)]
        wait_for(lambda: len(marked(marks, "hang")) >= 2, 120, "the first hung calls to start")
        # and three good ones arrive behind them
        t0 = time.monotonic()
        good = [push(client, "ok") for _ in range(3)]
        results = client.wait_rewards(good + hung, timeout=60)
        answered = time.monotonic() - t0
    finally:
        client.close()
        worker.terminate(30)
    # Then every good trajectory is ok, however long it waited for a process
    assert {k: (results[k].status, results[k].reward_score) for k in good} == {k: ("ok", 1.0) for k in good}, [
        results[k].error for k in good
    ]
    # And every hung one ended at its own 2 s budget
    assert {results[k].status for k in hung} == {"error"}
    assert all("timed out" in (results[k].error or "") for k in hung), [results[k].error for k in hung]
    log = worker.log()
    spares = log.count("starting spare process")
    print(
        "\ngood latencies (ms):",
        sorted(round(must(results[k].latency_ms)) for k in good),
        f"\nall answered {answered:.2f}s after the good ones were pushed; spares started: {spares}",
        f"\nhung: {results[hung[0]].error}",
    )
    # And spares stayed within --scorer-spares (2 by default) alive at once, each started for a
    # call waiting behind a stuck one: at most one per hung call, never a storm
    alive_at_start = [int(n) for n in re.findall(r"\((\d+) of at most 2 spares alive\)", log)]
    assert len(alive_at_start) == spares and max(alive_at_start) <= 2, alive_at_start
    assert 1 <= spares <= len(hung)


@pytest.fixture(scope="module")
def one_process_worker(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, RewardClient, Path]]:
    """A worker whose one scorer process serves every call in turn (so each call sees what the
    calls before it left), with a 3 s score timeout."""
    ns = f"sp-{uuid.uuid4().hex[:8]}"
    marks = tmp_path_factory.mktemp("marks")
    worker = start_worker(
        redis_url, ns, tmp_path_factory.mktemp("logs"), marks, scorer_processes=1, scorer_spares=0, score_timeout=3.0
    )
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        yield worker, client, marks
    finally:
        client.close()
        worker.terminate(30)
        _delete_namespace(redis_url, ns)


def state_seen(client: RewardClient) -> dict[str, object]:
    key = push(client, "state")
    r = client.wait_rewards([key], timeout=30)[key]
    assert r.status == "ok", r.error
    return dict(r.reward_extra_info)


def test_a_call_that_changes_its_process_leaves_the_next_call_a_clean_one(
    one_process_worker: tuple[WorkerProcess, RewardClient, Path],
) -> None:
    _, client, _ = one_process_worker
    before = state_seen(client)
    # Given a call that chdirs to /, changes PATH, sets a variable, ignores SIGTERM, leaves an
    # alarm pending, changes the umask and replaces sys.stdout, in the same scorer process
    tainted = push(client, "taint")
    assert client.wait_rewards([tainted], timeout=30)[tainted].status == "ok"
    # When the next call looks at its process
    after = state_seen(client)
    # Then it sees what the calls before the taint saw, in the same process
    assert after["pid"] == before["pid"]
    assert after == before
    assert (after["sigterm"], after["alarm"], after["taint"]) == ("SIG_DFL", 0, "")
    assert after["cwd"] != "/" and after["path"] != "/nowhere"


def test_the_children_a_call_leaves_are_gone_when_it_ends(
    one_process_worker: tuple[WorkerProcess, RewardClient, Path],
) -> None:
    _, client, marks = one_process_worker
    # Given a call that starts a child and a daemonised grandchild (its own session) and returns
    key = push(client, "fork")
    r = client.wait_rewards([key], timeout=30)[key]
    assert r.status == "ok", r.error
    # Then by the time its result is written, both are gone
    (mark,) = marked(marks, "fork")
    pids = [int(p) for p in mark.read_text().split()]
    mark.unlink()
    assert len(pids) == 2 and not any(alive(p) for p in pids), pids
    # And a call that forks and then hangs: its children go when its process is killed at the timeout
    key = push(client, "forkhang")
    wait_for(lambda: marked(marks, "fork") and marked(marks, "fork")[0].read_text(), 30, "the forkhang call")
    pids = [int(p) for p in marked(marks, "fork")[0].read_text().split()]
    assert all(alive(p) for p in pids)
    r = client.wait_rewards([key], timeout=30)[key]
    assert r.status == "error" and "timed out" in (r.error or ""), r.error
    wait_for(lambda: not any(alive(p) for p in pids), 10, "the hung call's children to be killed")


def test_100_mb_of_stdout_leaves_the_log_small_and_says_what_was_cut(
    one_process_worker: tuple[WorkerProcess, RewardClient, Path],
) -> None:
    worker, client, _ = one_process_worker
    size_before = worker.log_path.stat().st_size
    # Given a call that writes 100 MB to stdout (through sys.stdout and straight to fd 1)
    key = push(client, "spew:100000000")
    r = client.wait_rewards([key], timeout=60)[key]
    assert r.status == "ok", r.error
    wait_for(lambda: "were dropped" in worker.log(), 10, "the drop to be logged")
    # Then the log grew by about the cap (64 KiB), not by 100 MB
    grown = worker.log_path.stat().st_size - size_before
    assert grown < 1_000_000, grown
    # And it says how much was written and dropped, and the call's stderr line still got through
    line = next(x for x in worker.log().splitlines() if "were dropped" in x)
    assert "wrote 99999744 bytes to stdout in one call" in line and "99934208 were dropped" in line, line
    assert "misbehaving: spew done" in worker.log()
    # And the next call's output is not cut
    follow = push(client, "ok")
    assert client.wait_rewards([follow], timeout=30)[follow].reward_score == 1.0
    print(f"\nlog grew by {grown} bytes for 100 MB written; {json.dumps(line[-160:])}")


def test_a_forked_child_never_outlives_the_worker(redis_url: str, ns: str, tmp_path: Path) -> None:
    # Given a worker whose scorer process is hung in a call that forked a child and a daemon
    marks = tmp_path / "marks"
    marks.mkdir()
    worker = start_worker(redis_url, ns, tmp_path, marks, scorer_processes=1, score_timeout=300.0)
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        push(client, "forkhang")
        wait_for(lambda: marked(marks, "fork") and marked(marks, "fork")[0].read_text(), 30, "the forkhang call")
        pids = [int(p) for p in marked(marks, "fork")[0].read_text().split()]
        assert all(alive(p) for p in pids)
        scorer = int(marked(marks, "fork")[0].name.split("-")[1])
        forkserver = parent_of(scorer)
        assert forkserver != worker.pid  # the scorer process was started by the worker's forkserver
        # When the worker stops (SIGTERM)
        t0 = time.monotonic()
        assert worker.terminate(30) == 0, worker.log()
        # Then the children are gone by the time it has exited
        print(f"\nworker exited {time.monotonic() - t0:.2f}s after SIGTERM (shutdown_grace 3 s)")
        assert not any(alive(p) for p in pids), pids
        # And nothing they held keeps the forkserver alive after the worker
        wait_for(lambda: not alive(forkserver), 10, "the forkserver to exit")
    finally:
        client.close()
        worker.kill()


def test_a_stopped_worker_leaves_no_multiprocessing_folder(redis_url: str, ns: str, tmp_path: Path) -> None:
    # Given a worker whose scorer processes come from a forkserver (its socket in a pymp-* folder
    # under TMPDIR), that scored a trajectory
    tmp, marks = tmp_path / "tmp", tmp_path / "marks"
    tmp.mkdir()
    marks.mkdir()
    worker = WorkerProcess(
        redis_url,
        ns,
        cli=True,
        log_dir=tmp_path,
        env={"MISBEHAVING_MARKS": str(marks), "TMPDIR": str(tmp)},
        manager="naive",
        tokenizer="builtin:demo",
        reward_fn=f"{MISBEHAVING}:misbehave",
        shutdown_grace=3,
    )
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        assert worker.wait_for_log(f"worker {worker.name} started", START_TIMEOUT), worker.log()
        key = push(client, "ok")
        assert client.wait_rewards([key], timeout=60)[key].reward_score == 1.0
        assert [p.name for p in tmp.iterdir() if p.name.startswith("pymp-")], "no forkserver folder to remove"
        # When it is stopped (it ends with os._exit, skipping multiprocessing's exit handler)
        assert worker.terminate() == 0, worker.log()
    finally:
        worker.kill()
        client.close()
    # Then the folder is gone with it
    assert [p.name for p in tmp.iterdir() if p.name.startswith("pymp-")] == []
