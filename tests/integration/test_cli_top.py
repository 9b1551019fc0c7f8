"""``rewardq top`` as a person uses it: in a terminal (tmux), watching a running namespace, quit with q.

A real ``rewardq worker`` scores demo trajectories (naive manager) while the test pushes more than
it can score at once; one trajectory has an unknown data source (an error result, the worker's
last error) and one misses an output (the oldest waiting). tmux runs on a socket of its own
(``-L``), which the test kills at the end.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rewardq import RewardClient
from rewardq.demo.data import make_trajectories
from rewardq.reward.tokenizer import load_tokenizer
from tests.conftest import _delete_namespace
from tests.support.cli_procs import REPO, START_WAIT, Procs, wait_for, worker_argv

pytestmark = pytest.mark.slow

PACED_SCORER = """
import time
from rewardq.reward.scoring import default_compute_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    time.sleep(0.01)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
"""


def _workload(client: RewardClient, n: int) -> None:
    ids = np.arange(1, 6)
    client.put_trajectory("bad", "1", [{"prompt_ids": ids, "response_ids": ids}], {"data_source": "no/such_source"})
    client.put_output("gap", "1", 0, {"prompt_ids": ids, "response_ids": ids}, {"data_source": "openai/gsm8k"})
    client.put_output(
        "gap", "1", 2, {"prompt_ids": ids, "response_ids": ids}, {"data_source": "openai/gsm8k"}, final=True
    )
    for t in make_trajectories(n, seed=7, tokenizer=load_tokenizer("builtin:demo")):
        client.put_trajectory(t["uid"], t["session_id"], t["outputs"], t["sample"])


@pytest.fixture(scope="module")
def busy_namespace(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A namespace with a live worker, a backlog, an error and a trajectory missing output 1 (one per module)."""
    ns, procs = f"t-top-{uuid.uuid4().hex[:8]}", Procs(tmp_path_factory.mktemp("top"))
    # a worker that scores ~100 outputs/s, so the backlog lasts while top is watched
    paced = tmp_path_factory.mktemp("paced") / "paced.py"
    paced.write_text(PACED_SCORER)
    argv = worker_argv(redis_url, ns, "topw", "--manager", "naive", "--concurrency", "1", "--reward-fn", str(paced))
    worker = procs.start([*argv, "--reward-fn-placement", "thread"], tag="w")
    client = RewardClient.from_url(redis_url, namespace=ns)
    wait_for(lambda: client.r.zcard(f"{ns}:workers"), 120, "the worker to beat", procs=[worker])
    _workload(client, 1500)
    wait_for(lambda: client.r.exists(f"{ns}:{{s0}}:reward:bad_1_0"), 60, "the error result", procs=[worker])
    try:
        yield ns
    finally:
        client.close()
        procs.kill_all()
        _delete_namespace(redis_url, ns)


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=10).stdout


def test_top_in_a_terminal_shows_rates_backlog_workers_and_quits_on_q(busy_namespace: str, redis_url: str) -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is needed (.ci/run installs it from the Debian packages)")
    ns, sock = busy_namespace, f"rq-top-{uuid.uuid4().hex[:8]}"
    top = f"{sys.executable} -m rewardq top --redis-url {redis_url} --namespace {ns}"
    cmd = f"cd {REPO} && {top}; echo TOP-EXIT=$?; sleep 60"
    subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-s", "top", "-x", "100", "-y", "45", cmd], check=True)
    try:

        def screen() -> str:
            return _tmux(sock, "capture-pane", "-p", "-t", "top")

        backlog = (
            r"backlog\s+[1-9][\d,]* entries( \(estimated\))?, drains in \d[\d.smhd]* at [\d.]*[1-9][\d.]* outputs/s"
        )

        def scoring() -> bool:
            # the namespace's rate comes from the results, the drain rate from the workers' next
            # heartbeat: wait for both (a beat apart) rather than read the screen in between
            s = screen()
            m = re.search(r"scored/s\s+([\d.]+)", s)
            return bool(m and float(m.group(1)) > 0 and "topw" in s and re.search(backlog, s))

        wait_for(scoring, 60, "top to show the worker, a non-zero rate and the backlog's drain time")
        text = screen()
        assert re.search(r"errors/s\s+[\d.]+", text), text
        assert "topw" in text and "bad_1" in text, text  # the worker and its last error
        assert "oldest waiting gap_1" in text and "outputs 1" in text, text
        assert "openai/gsm8k" in text or "lighteval/MATH" in text, text  # slowest data sources
        first = text
        time.sleep(2.5)
        assert screen() != first  # refreshed (the clock and the rates move)
        _tmux(sock, "send-keys", "-t", "top", "q")
        wait_for(lambda: "TOP-EXIT=0" in screen(), 15, "top to quit on q")
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=10)


def test_top_piped_prints_one_snapshot_and_exits(busy_namespace: str, redis_url: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "rewardq", "top", "--redis-url", redis_url, "--namespace", busy_namespace],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    assert "scored/s" in run.stdout and "workers (1)" in run.stdout and "topw" in run.stdout
    assert all(len(line) <= 80 for line in run.stdout.splitlines()), run.stdout  # 80 columns without a terminal
    js = subprocess.run(
        [sys.executable, "-m", "rewardq", "top", "--json", "--redis-url", redis_url, "--namespace", busy_namespace],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    snap = json.loads(js.stdout)
    assert snap["workers"][0]["name"] == "topw" and snap["oldest_waiting"]["missing"] == [1]
    assert set(snap["backlog"]) >= {"entries", "outputs_per_s", "seconds"}
    assert len(snap["scored_per_second"]) == 300 and sum(snap["scored_per_second"]) > 0
    assert snap["workers"][0]["last_error"]["tid"] == "bad_1"


def test_a_restarted_workers_error_from_before_its_restart_is_labelled_so(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ns, procs = f"t-top-life-{uuid.uuid4().hex[:8]}", Procs(tmp_path_factory.mktemp("top-life"))
    client = RewardClient.from_url(redis_url, namespace=ns)
    ids = np.arange(1, 6)
    argv = worker_argv(redis_url, ns, "lifew", "--manager", "naive")

    def bad(uid: str) -> None:  # an unknown data source: an error result
        client.put_trajectory(uid, "1", [{"prompt_ids": ids, "response_ids": ids}], {"data_source": "no/such_source"})
        wait_for(lambda: client.r.exists(f"{ns}:{{s0}}:reward:{uid}_1_0"), 60, f"the error result of {uid}")

    def snapshot() -> tuple[dict[str, Any], str]:
        top = [sys.executable, "-m", "rewardq", "top", "--redis-url", redis_url, "--namespace", ns]
        js = subprocess.run([*top, "--json"], capture_output=True, text=True, timeout=60, cwd=REPO)
        text = subprocess.run(top, capture_output=True, text=True, timeout=60, cwd=REPO)
        [worker] = json.loads(js.stdout)["workers"]
        return worker, text.stdout

    try:
        # Given a worker that wrote an error result, then restarted under the same name
        first = procs.start(argv, tag="first")
        wait_for(lambda: client.r.zcard(f"{ns}:workers"), START_WAIT, "the first life to beat", procs=[first])
        bad("early")
        assert first.terminate() == 0, first.stderr()[-2000:]
        second = procs.start(argv, tag="second")
        wait_for(
            lambda: client.r.hget(f"{ns}:worker:lifew", "pid") == str(second.pid).encode(),
            START_WAIT,
            "the second life to beat",
            procs=[second],
        )
        # When top shows it, the error is labelled as from before the restart, beside its 0 errors
        worker, text = snapshot()
        assert worker["errors"] == 0 and worker["last_error"]["tid"] == "early_1"
        assert worker["last_error"]["previous_life"] is True
        assert "before restart, " in text and "early_1" in text, text
        # and an error of the current life is shown as it is
        bad("late")
        beat = f"{ns}:worker:lifew"
        wait_for(lambda: client.r.hget(beat, "errors") == b"1", 30, "the heartbeat to count the error", procs=[second])
        worker, text = snapshot()
        assert worker["last_error"]["tid"] == "late_1" and worker["last_error"]["previous_life"] is False
        assert "before restart" not in text and "late_1" in text, text
    finally:
        client.close()
        procs.kill_all()
        _delete_namespace(redis_url, ns)
