"""The judge cache shared across runs (genrm ``judge_cache=shared``): real `rewardq worker` processes
in three namespaces on the real Redis against the stand-in judge (4 s per answer), which counts the
requests it receives. A second run with the same judge configuration pays nothing; a changed rubric
pays again; `status`, `top`, `/metrics` show the hits and what they saved; `rewardq judge-cache`
lists and clears them per model."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewardq import RewardClient
from rewardq.reward.judge.shared import clear_shared, model_tag
from tests.conftest import _delete_namespace
from tests.integration.test_genrm_fleet import FAST, SAMPLE, both_alive, config_file, start_workers
from tests.support.cli_procs import Procs
from tests.support.judge_standin import JudgeStandin
from tests.support.records import text_output
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.slow

N = 100
RUBRIC_V2 = (
    "Rubric v2: grade strictly.\nQuestion: {question}\nReference answer: {ground_truth}\n\n"
    "Model's answer: {response}\n\n{format_instructions}"
)


@pytest.fixture
def judge(tmp_path: Path) -> Iterator[JudgeStandin]:
    s = JudgeStandin(tmp_path)
    s.control(delay=4.0)
    yield s
    s.stop()


@pytest.fixture
def other_namespaces(redis_url: str) -> Iterator[list[str]]:
    names = [f"t-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    yield names
    for name in names:
        _delete_namespace(redis_url, name)


def run_once(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, config: str, name: str
) -> tuple[dict[str, Any], Any]:
    """One worker in ``ns`` judges the same N trajectories; their results, and the worker (running)."""
    [w] = start_workers(procs, redis_url, ns, [name], config, *FAST, "--concurrency", "128", "--metrics-port", "0")
    both_alive(sync_redis, ns, [name], [w])
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = [
        client.put_trajectory(f"t{i}", "s", [text_output(f"case {i} grade=0.{i % 10}")], SAMPLE)[0] for i in range(N)
    ]
    results = client.wait_rewards(keys, timeout=240)
    for i, key in enumerate(keys):
        assert results[key].status == "ok" and results[key].reward_score == pytest.approx(i % 10 / 10), results[key]
    client.close()
    return results, w


def test_a_second_run_with_the_same_judge_pays_nothing_and_a_changed_rubric_pays_again(
    procs: Procs,
    redis_url: str,
    ns: str,
    other_namespaces: list[str],
    sync_redis: SyncClient,
    judge: JudgeStandin,
    tmp_path: Path,
) -> None:
    model = f"judge-{uuid.uuid4().hex[:8]}"  # a model of its own: no other test's shared answers
    shared = {"judge_cache": "shared", "model": model, "max_concurrent": 128}
    (tmp_path / "a").mkdir()
    (tmp_path / "c").mkdir()
    config = config_file(tmp_path / "a", judge, **shared)
    second, changed = other_namespaces
    try:
        # Given a first run (namespace 1) that judged N trajectories: N requests
        first, w1 = run_once(procs, redis_url, ns, sync_redis, config, "s1")
        assert judge.stats()["received"] == N
        assert not any(r.reward_extra_info["judge_cached"] for r in first.values())
        assert w1.terminate() == 0, w1.stderr()[-2000:]
        # When a second run (another namespace) judges the same N with the same judge configuration
        again, w2 = run_once(procs, redis_url, second, sync_redis, config, "s2")
        # Then the judge receives no request: every answer comes from the shared cache
        assert judge.stats()["received"] == N
        assert all(r.reward_extra_info["judge_cached"] for r in again.values())
        # ... and its status, top and /metrics show the hits and the tokens they saved
        rc, proc = procs.run(["status", "--redis-url", redis_url, "--namespace", second, "--json"], tag="status")
        j = json.loads(proc.stdout())["judges"][model]
        saved = sum(
            r.reward_extra_info["judge_prompt_tokens"] + r.reward_extra_info["judge_completion_tokens"]
            for r in again.values()
        )
        assert (j["requests"], j["cache_hits"], j["shared_hits"], j["saved_tokens"]) == (0, N, N, saved), j
        rc, proc = procs.run(["status", "--redis-url", redis_url, "--namespace", second], tag="status-text")
        assert f"{N} ({N} shared)" in proc.stdout() and f"{saved:,}" in proc.stdout(), proc.stdout()
        rc, proc = procs.run(["top", "--redis-url", redis_url, "--namespace", second, "--json"], tag="top")
        assert json.loads(proc.stdout())["judges"][model]["saved_tokens"] == saved
        rc, proc = procs.run(["top", "--redis-url", redis_url, "--namespace", second, "--once"], tag="top-text")
        assert f"{N} cache hits ({N} shared), {saved:,} tokens saved" in " ".join(proc.stdout().split()), proc.stdout()
        port = int(re.search(r"metrics on http://0\.0\.0\.0:(\d+)/metrics", w2.stderr()).group(1))  # type: ignore[union-attr]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert f'rewardq_judge_shared_hits_total{{model="{model}"}} {N}.0' in metrics
        assert f'rewardq_judge_saved_tokens_total{{model="{model}"}} {saved}.0' in metrics
        assert w2.terminate() == 0, w2.stderr()[-2000:]
        # When a third run changes only the rubric's text
        config_v2 = config_file(tmp_path / "c", judge, **shared, prompt_template=RUBRIC_V2)
        third, w3 = run_once(procs, redis_url, changed, sync_redis, config_v2, "s3")
        # Then every question is asked again: N more requests
        assert judge.stats()["received"] == 2 * N
        assert not any(r.reward_extra_info["judge_cached"] for r in third.values())
        assert w3.terminate() == 0, w3.stderr()[-2000:]
        # And `rewardq judge-cache list` shows the model's 2N answers; `clear --model` deletes them
        rc, proc = procs.run(["judge-cache", "list", "--redis-url", redis_url, "--model", model, "--json"], tag="l")
        assert json.loads(proc.stdout())["models"][0]["entries"] == 2 * N
        rc, proc = procs.run(["judge-cache", "clear", "--redis-url", redis_url, "--model", model], tag="c")
        assert rc == 0 and f"{model}: {2 * N} shared answers deleted" in proc.stdout(), proc.stdout()
        assert not list(sync_redis.scan_iter(match=f"rewardq-judge-cache:{{{model_tag(model)}}}:*", count=1000))
        rc, proc = procs.run(["judge-cache", "list", "--redis-url", redis_url, "--model", model, "--json"], tag="l2")
        assert json.loads(proc.stdout())["models"] == []
        print(
            f"shared judge cache: run 1 {N} requests; run 2 (another namespace) 0 requests, {N} shared hits, "
            f"{saved:,} tokens saved; changed rubric {N} requests"
        )
    finally:
        clear_shared(sync_redis, model)
