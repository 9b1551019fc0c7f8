r"""The ``numina_*`` and ``hiyouga/geometry3k`` scorers in a real ``rewardq worker`` on the real Redis.

A ``naive`` worker routes these data sources to its scorer processes (placement ``process``):
every known answer of :mod:`tests.support.math_cases` comes back with verl's score; a sample
whose sympy comparison runs into the 10 s limit is scored 0.0 by the ``SIGALRM`` limit in the
main thread of a scorer process, while trajectories pushed after it are scored at once (the
worker's event loop never waits for sympy).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewardq.producers.client import RewardClient
from tests.conftest import _delete_namespace
from tests.support.checks import must
from tests.support.cli_procs import START_WAIT
from tests.support.math_cases import CASES, SLOW_CASES
from tests.support.proc_worker import WorkerProcess
from tests.support.records import text_output

pytestmark = pytest.mark.slow

START_TIMEOUT = START_WAIT


def push(client: RewardClient, data_source: str, response: str, truth: Any) -> str:
    """One single-output trajectory; returns its key."""
    sample = {"data_source": data_source, "reward_model": {"ground_truth": truth}, "extra_info": {}}
    (key,) = client.put_trajectory(f"u-{uuid.uuid4().hex[:10]}", "0", [text_output(response, "Solve it.")], sample)
    return key


@pytest.fixture
def math_worker(redis_url: str, tmp_path: Path) -> Iterator[tuple[WorkerProcess, RewardClient]]:
    ns = f"math-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        redis_url,
        ns,
        cli=True,
        log_dir=tmp_path,
        manager="naive",
        tokenizer="builtin:demo",
        scorer_processes=2,
        score_timeout=120,
        shutdown_grace=3,
    )
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        assert worker.wait_for_log(f"worker {worker.name} started", START_TIMEOUT), worker.log()
        yield worker, client
    finally:
        client.close()
        worker.terminate(30)
        _delete_namespace(redis_url, ns)


def test_a_worker_scores_numina_and_geometry3k_as_verl_does(math_worker: tuple[WorkerProcess, RewardClient]) -> None:
    worker, client = math_worker
    # Given a slow numina sample (sympy runs into its 10 s limit), pushed first
    (_, slow_response, slow_truth, slow_expected) = SLOW_CASES[0]
    slow = push(client, "numina_olympiads", slow_response, slow_truth)
    time.sleep(1.0)
    # When GSM8K trajectories are pushed right behind it, then every known answer
    gsm8k = [push(client, "openai/gsm8k", "so #### 18", "18") for _ in range(5)]
    keys = {push(client, ds, response, truth): expected for ds, response, truth, expected in CASES}
    results = client.wait_rewards([*keys, *gsm8k], timeout=90)
    # Then each gets verl's score, or an error result naming verl's exception
    for key, expected in keys.items():
        r = results[key]
        if isinstance(expected, type):
            assert r.status == "error" and expected.__name__ in (r.error or ""), (key, r.error)
        else:
            assert (r.status, r.reward_score, r.reward_extra_info) == ("ok", expected, {"acc": expected}), key
    assert {(results[k].status, results[k].reward_score) for k in gsm8k} == {("ok", 1.0)}
    # And the slow sample is scored 0.0 once sympy's 10 s limit fires (not an error, not the score timeout)
    r = client.wait_rewards([slow], timeout=60)[slow]
    assert (r.status, r.reward_score) == ("ok", slow_expected), r.error
    # ... and the GSM8K trajectories pushed right behind it (milliseconds of work each, inline, with
    # slots free) were not held up by it: each was scored before its 10 s limit ended it
    assert all(must(results[k].scored_at) < must(r.scored_at) for k in gsm8k), [results[k].scored_at for k in gsm8k]
    assert 9_000 < must(r.latency_ms) < 60_000
    assert "built-in scorers with placement 'process' run" in worker.log()
