"""One of verl's reward-loop processes, for tests/verl/test_fleet_budget.py: the hook scoring a run.

:func:`child` (or ``python -m tests.verl.budget_process NAMESPACE WINDOW DIR GOOD``) builds the hook
(``RewardqRewardManager``) from a verl trainer config as a reward-loop actor does, then, through
verl's own ``AgentLoopWorker._compute_score``, in three phases, each started when the test creates
``DIR/go-<phase>`` (so every process runs each phase side by side, and no process runs ahead into the
next) and ended by creating ``DIR/done-<phase>-<pid>``:

1. scores trajectories whose reward function raises until the run's failure budget stops it;
2. scores ``GOOD`` healthy trajectories (the cause is fixed);
3. scores one more failing trajectory (the budget has recovered: it is not stopped).

It writes ``DIR/result-<pid>.json`` (the CLI prints it as one JSON line instead): how many failing
trajectories it scored before the stop, the stop's message, the healthy rewards and any error they
raised, and whether the last failure stopped; an exception that ended it goes to ``DIR/error-<pid>.txt``.

The test forks its processes from a fork server that imported this module (verl, torch, rewardq)
once: each was a fresh interpreter importing them on its own before, ~15 s of CPU apiece on a 2-core
machine. Each child builds its own hook, event loop and Redis connections after the fork.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from rewardq.errors import RunStopped
from rewardq.integrations.verl import RewardqRewardManager
from tests.verl.data import output, row
from tests.verl.harness import LocalHandle, bare_agent_loop_worker, hook_config

#: Failing trajectories one process scores at most (the stop comes long before).
LIMIT = 200


async def score(w: Any, response: str, i: int) -> float | None:
    outputs = [output("turn"), output(response)]
    await AgentLoopWorker._compute_score(w, outputs, kwargs=row("openai/gsm8k", "1", index=i))
    reward: float | None = outputs[-1].reward_score
    return reward


def phase(folder: Path, n: int) -> None:
    """Mark phase ``n - 1`` done (from phase 2 on), then wait for the test to start phase ``n``."""
    if n > 1:
        (folder / f"done-{n - 1}-{os.getpid()}").touch()
    while not (folder / f"go-{n}").exists():
        time.sleep(0.05)


async def main(namespace: str, window: int, folder: Path, good: int) -> dict[str, Any]:
    cfg = hook_config("/unused", namespace, verl_max_error_rate=0.5, verl_error_window=window)
    hook = RewardqRewardManager(cfg, None)  # type: ignore[arg-type]  # verl gives no tokenizer without a model
    w = bare_agent_loop_worker(AgentLoopWorker, [LocalHandle(hook)])
    phase(folder, 1)
    out: dict[str, Any] = {"failed_before_stop": 0, "stop": None, "good": [], "good_errors": []}
    for i in range(LIMIT):
        try:
            await score(w, "FAIL #### 1", i)
        except RunStopped as exc:
            out["stop"] = str(exc)
            break
        out["failed_before_stop"] += 1
    phase(folder, 2)
    for i in range(good):
        try:
            out["good"].append(await score(w, "#### 1", i))
        except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts there is none
            out["good_errors"].append(repr(exc))
    phase(folder, 3)
    try:
        await score(w, "FAIL #### 1", LIMIT)
        out["stopped_after_recovery"] = False
    except RunStopped:
        out["stopped_after_recovery"] = True
    (folder / f"done-3-{os.getpid()}").touch()
    return out


def child(namespace: str, window: int, folder: Path, good: int) -> None:
    """One process's run (the target of the test's forked processes): its result, or its error, in ``folder``."""
    try:
        out = asyncio.run(main(namespace, window, folder, good))
    except BaseException:
        (folder / f"error-{os.getpid()}.txt").write_text(traceback.format_exc())
        raise
    (folder / f"result-{os.getpid()}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    ns, size, phases, healthy = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(main(ns, size, phases, healthy))), flush=True)
