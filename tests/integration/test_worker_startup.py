"""A starting worker says what it is doing: one line before each slow step and its time after it."""

from __future__ import annotations

import re

import pytest

from tests.support.cli_procs import Procs, wait_for, worker_argv
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.slow

#: The manager is built before Redis is waited for: a wrong one must not wait (exit 2 at once).
STEPS = (
    "importing torch, tensordict and the reward managers",
    "loading the tokenizer (builtin:demo)",
    "building the naive manager",
    "connecting to Redis at {redis_url}",
    "agreeing on the namespace's scoring configuration",
    "setting up the naive manager",
    "starting the scorer processes",
)


def test_startup_steps_are_logged_in_order_with_their_times(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    w = procs.start(worker_argv(redis_url, ns, "su", "--manager", "naive"), tag="w")
    wait_for(lambda: sync_redis.zcard(f"{ns}:workers"), 120, "the worker to beat", procs=[w])
    assert w.terminate() == 0
    log = w.stderr()
    at = []
    for step in (s.format(redis_url=redis_url) for s in STEPS):
        begin = log.index(f"start-up: {step} ...")
        done = re.search(re.escape(f"start-up: {step}: done in ") + r"\d+\.\ds", log)
        assert done and done.start() > begin, (step, log[-3000:])
        at.append(begin)
    assert at == sorted(at) and at[-1] < log.index("worker su started")
