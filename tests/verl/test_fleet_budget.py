"""The failure budget is counted once for the whole run, across every process that scores it.

verl starts 8 reward-loop actors by default and picks one at random per trajectory. Here 8 separate
processes each run the hook (tests/verl/budget_process.py, built from the trainer config as a
reward-loop actor builds it) against one fleet, with every trajectory failing: the run stops after
exactly ``window - 1`` failed trajectories in all (the ``window``-th stops it), not 8 windows' worth;
every process is stopped at its next failure; once the cause is fixed no healthy trajectory raises,
and after a window of healthy ones a failure no longer stops the run. The processes are forked from
a fork server that imported verl and rewardq once (tests/verl/budget_process.py).
"""

from __future__ import annotations

import functools
import json
import multiprocessing
from multiprocessing.process import BaseProcess
from pathlib import Path

from tests.support.cli_procs import wait_for
from tests.support.sync_client import SyncClient
from tests.verl import budget_process
from tests.verl.conftest import Fleet

PROCESSES = 8
WINDOW = 16
GOOD = 3  # per process: 24 healthy trajectories in all, more than a window


def error_of(folder: Path, p: BaseProcess) -> str:
    err = folder / f"error-{p.pid}.txt"
    return err.read_text()[-3000:] if err.exists() else "(no error file)"


def phase_done(folder: Path, n: int, procs: list[BaseProcess]) -> bool:
    dead = [p for p in procs if p.exitcode is not None and not (folder / f"done-{n}-{p.pid}").exists()]
    if dead:
        raise AssertionError(f"a hook process exited with {dead[0].exitcode}: {error_of(folder, dead[0])}")
    return len(list(folder.glob(f"done-{n}-*"))) == len(procs)


def test_eight_hook_processes_share_one_budget_window(
    failing_fleet: Fleet, module_redis: SyncClient, tmp_path: Path
) -> None:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([budget_process.__name__])
    args = (failing_fleet.namespace, WINDOW, tmp_path, GOOD)
    procs: list[BaseProcess] = [ctx.Process(target=budget_process.child, args=args) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    try:
        for n in (1, 2, 3):  # every process runs each phase side by side (budget_process.py)
            (tmp_path / f"go-{n}").touch()
            wait_for(functools.partial(phase_done, tmp_path, n, procs), 600, f"phase {n} of every process")
        results = []
        for p in procs:
            p.join(600)
            assert p.exitcode == 0, error_of(tmp_path, p)
            results.append(json.loads((tmp_path / f"result-{p.pid}.json").read_text()))
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
    # one window for the run: exactly WINDOW - 1 failures went through before the stop, in all
    assert sum(r["failed_before_stop"] for r in results) == WINDOW - 1
    for r in results:
        stop = r["stop"]
        assert stop is not None and f"of the run's last {WINDOW} trajectories" in stop
        assert "counted across every adapter and hook process" in stop and "scorer" in stop
        # the cause is fixed: healthy trajectories are scored and never raise
        assert r["good_errors"] == [] and r["good"] == [1.0] * GOOD
        assert r["stopped_after_recovery"] is False  # a window of healthy ones: one failure is within budget
    key = f"{failing_fleet.namespace}:verl-budget:local"
    assert int(module_redis.hget(key, "seq") or 0) == (WINDOW - 1) + PROCESSES + PROCESSES * GOOD + PROCESSES
