"""Each failure kind, read back from real worker processes through every door an operator uses.

Given real ``rewardq worker`` processes and trajectories that fail each way the issue names (an
unknown data source, a reward function that raises, a scorer past ``score_timeout``, a judge
answering 503 and a judge answering 401), every key reads back with its failure kind through
``RewardClient``, ``rewardq inspect --json``, ``rewardq status --json`` (per data source) and the
worker's ``/metrics``; the healthy trajectories beside them are scored.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewardq import FailureKind, RewardClient
from tests.support.checks import must
from tests.support.cli_procs import REPO, START_WAIT, Proc, Procs, wait_for, worker_argv
from tests.support.judge_standin import JudgeStandin
from tests.support.records import text_output
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.timeout(300)

FAST = ["--heartbeat-interval", "0.5", "--maintenance-interval", "0.5", "--metrics-port", "0"]
KIND_SCORERS = REPO / "tests" / "support" / "kind_scorers.py"


@pytest.fixture
def judge(tmp_path: Path) -> Iterator[JudgeStandin]:
    s = JudgeStandin(tmp_path)
    yield s
    s.stop()


def sample(data_source: str, ground_truth: str = "42") -> dict[str, Any]:
    return {"data_source": data_source, "reward_model": {"ground_truth": ground_truth}}


def metrics_of(w: Proc) -> str:
    port = int(must(re.search(r"metrics on http://0\.0\.0\.0:(\d+)/metrics", w.stderr())).group(1))
    text: str = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return text


def status_of(procs: Procs, redis_url: str, ns: str) -> dict[str, Any]:
    code, proc = procs.run(["status", "--redis-url", redis_url, "--namespace", ns, "--json"], tag="status")
    assert code == 0, proc.stderr()
    out: dict[str, Any] = json.loads(proc.stdout())
    return out


def inspected(procs: Procs, redis_url: str, ns: str, key: str) -> dict[str, Any]:
    code, proc = procs.run(["inspect", key, "--redis-url", redis_url, "--namespace", ns, "--json"], tag="inspect")
    assert code == 0, proc.stderr()
    out: dict[str, Any] = json.loads(proc.stdout())
    return out


def read_back(
    procs: Procs, redis_url: str, ns: str, w: Proc, client: RewardClient, cases: dict[str, tuple[str, str, FailureKind]]
) -> None:
    """Every case ``{key: (data source, words of its error, kind)}`` reads back with its kind through
    the client, ``inspect --json``, ``status --json`` and ``/metrics``."""
    results = client.wait_rewards(list(cases), timeout=120)
    for key, (_, words, kind) in cases.items():
        r = results[key]
        assert r.status == "error" and r.reward_score is None and r.failure_kind is kind, r
        assert words in (r.error or ""), (key, r.error)
        view = inspected(procs, redis_url, ns, key)
        assert view["outputs"][0]["result"]["failure_kind"] == kind.value
        assert view["meta"]["failure_kind"] == kind.value and view["state"] == "done"
    expected: dict[str, dict[str, int]] = {}
    for ds, _, kind in cases.values():
        expected.setdefault(ds, dict.fromkeys((k.value for k in FailureKind), 0))[kind.value] += 1

    def counted() -> bool:  # the heartbeat after the last failure has been published
        return all(status_of(procs, redis_url, ns)["failures"].get(ds) == kinds for ds, kinds in expected.items())

    wait_for(counted, 20, "status --json to count the failures per data source and kind", poll=0.5, procs=[w])
    metrics = metrics_of(w)
    for ds, kinds in expected.items():
        for kind_name, n in kinds.items():
            line = f'rewardq_failures_total{{data_source="{ds}",kind="{kind_name}"}} {n}.0'
            assert (line in metrics) == (n > 0), (line, [m for m in metrics.splitlines() if "failures" in m])


def test_an_unknown_data_source_a_raising_function_and_a_timeout_read_back_with_their_kinds(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    # Given a worker whose reward function raises or hangs on request (in its scorer processes),
    # else scores with the default scorer, which knows no data source "no-such-source"
    argv = worker_argv(redis_url, ns, "kinds", "--reward-fn", f"{KIND_SCORERS}:compute_score", "--score-timeout", "3")
    w = procs.start([*argv, *FAST], tag="kinds")
    wait_for(lambda: sync_redis.exists(f"{ns}:worker:kinds"), START_WAIT, "the worker's heartbeat", procs=[w])
    client = RewardClient.from_url(redis_url, namespace=ns)
    put = client.put_trajectory
    # When it scores them, beside a healthy GSM8K one
    cases = {
        put("unknown", "0", [text_output("so #### 42")], sample("no-such-source"))[0]: (
            "no-such-source",
            "no-such-source",
            FailureKind.CONFIG,
        ),
        put("raises", "0", [text_output("raise")], sample("openai/gsm8k"))[0]: (
            "openai/gsm8k",
            "ValueError: the reward function cannot read this response",
            FailureKind.SCORER,
        ),
        put("hangs", "0", [text_output("hang")], sample("openai/gsm8k"))[0]: (
            "openai/gsm8k",
            "timed out",
            FailureKind.TIMEOUT,
        ),
    }
    healthy = put("healthy", "0", [text_output("so #### 42")], sample("openai/gsm8k"))[0]
    # Then each reads back with its kind everywhere, and the healthy one is a reward
    read_back(procs, redis_url, ns, w, client, cases)
    ok = client.wait_rewards([healthy], timeout=30)[healthy]
    assert ok.ok and ok.reward_score == 1.0 and ok.failure_kind is None
    client.close()
    assert w.terminate() == 0, w.stderr()[-2000:]


def test_a_judge_answering_503_and_one_answering_401_read_back_with_their_kinds(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, judge: JudgeStandin, tmp_path: Path
) -> None:
    # Given a genrm worker retrying transient failures for 3 s, and a judge answering 503 (with
    # Retry-After: 1) to one request for ever and 401 to another
    config = judge.genrm_config(tmp_path, model="j")
    judge.control(retry_after=1)
    argv = worker_argv(redis_url, ns, "judged", "--config", str(config), "--retry-for", "3")
    w = procs.start([*argv, *FAST], tag="judged")
    wait_for(lambda: sync_redis.exists(f"{ns}:worker:judged"), START_WAIT, "the worker's heartbeat", procs=[w])
    client = RewardClient.from_url(redis_url, namespace=ns)
    put = client.put_trajectory
    cases = {
        put("down", "0", [text_output("judge-fail=503")], sample("judged"))[0]: (
            "judged",
            "answered HTTP 503: injected 503 (Retry-After: 1s)",
            FailureKind.TRANSIENT,
        ),
        put("refused", "0", [text_output("judge-fail=401")], sample("judged"))[0]: (
            "judged",
            "answered HTTP 401: injected 401",
            FailureKind.CONFIG,
        ),
    }
    healthy = put("healthy", "0", [text_output("grade=0.75")], sample("judged"))[0]
    read_back(procs, redis_url, ns, w, client, cases)
    assert client.wait_rewards([healthy], timeout=30)[healthy].reward_score == 0.75
    # the 503 was tried again in place (each after its Retry-After) until retry_for ran out; the 401 once
    down = client.get_rewards([next(iter(cases))])
    assert "retry_for=3s ran out" in (must(down[next(iter(cases))]).error or "")
    log = judge.requests()
    tries = [e for e in log if e["status"] == 503]
    assert len(tries) >= 2 and [e["status"] for e in log].count(401) == 1
    assert all(b["t"] - a["t"] >= 1.0 - 0.05 for a, b in zip(tries, tries[1:])), [e["t"] for e in tries]
    assert re.search(r'rewardq_retries_total\{data_source="judged"\} [1-9]', metrics_of(w))
    client.close()
    assert w.terminate() == 0, w.stderr()[-2000:]
