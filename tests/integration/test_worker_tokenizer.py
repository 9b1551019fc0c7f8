"""A worker never scores with the wrong tokenizer: none by default, the trainer's checked on every record.

* ``rewardq worker`` without ``--tokenizer`` (flag, REWARDQ_TOKENIZER, config) exits 2 naming it, with
  and without ``--processes``, before it waits for Redis;
* a Hub id is read from the local Hugging Face cache offline (here without transformers, through
  huggingface_hub), with no network attempt even when offline mode is not set; one that is not
  cached exits 2 at once naming it and how to fill the cache;
* records carrying another tokenizer's fingerprint get an error result for every key of their
  trajectory naming both tokenizers (dead letter kind ``tokenizer``); records carrying the worker's
  own, or none, are scored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rewardq.consumers.worker import Worker
from rewardq.producers.aio import AsyncRewardClient
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RewardResult
from rewardq.reward.factory import build_manager
from rewardq.reward.tokenizer import DEMO_PATH, load_tokenizer
from rewardq.reward.tokenizer_fingerprint import tokenizer_fingerprint
from tests.support.checks import must
from tests.support.cli_procs import Procs, wait_for, worker_argv
from tests.support.helpers import running_workers
from tests.support.hf_cache import fake_hub_cache
from tests.support.no_network import NetworkTrap
from tests.support.records import text_output
from tests.support.sync_client import SyncClient

UNREACHABLE = "redis://127.0.0.1:1/0"  # never reached: the tokenizer is checked first


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "env"),
    [
        ([], {}),
        (["--processes", "2"], {}),
        ([], {"REWARDQ_TOKENIZER": ""}),  # set but empty is not a tokenizer either
    ],
    ids=["plain", "processes", "empty-env"],
)
def test_no_tokenizer_exits_2_naming_the_flag(procs: Procs, extra: Any, env: dict[str, Any]) -> None:
    rc, proc = procs.run(
        ["worker", "--redis-url", UNREACHABLE, "--namespace", "t-never", "--connect-timeout", "1", *extra],
        env=env,
        timeout=60,
    )
    err = proc.stderr()
    assert rc == 2, err[-2000:]
    assert "no tokenizer given" in err and "--tokenizer" in err and "REWARDQ_TOKENIZER" in err


@pytest.mark.slow
def test_a_hub_id_comes_from_the_local_cache_offline(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, tmp_path: Path
) -> None:
    """Offline mode is not set: the worker stays off the network by itself (the trap counts every try)."""
    home = tmp_path / "hf"
    config = json.dumps({"eos_token": "<|im_end|>"}).encode()
    fake_hub_cache(home, "acme/policy-7b", {"tokenizer.json": DEMO_PATH.read_bytes(), "tokenizer_config.json": config})
    with NetworkTrap() as trap:
        env = {"HF_HOME": str(home), **trap.env}
        worker = procs.start(worker_argv(redis_url, ns, "hub", tokenizer="acme/policy-7b"), env=env, tag="hub")
        wait_for(lambda: sync_redis.exists(f"{ns}:worker:hub"), 240, "the worker", procs=[worker])
        assert worker.terminate() == 0
    assert trap.connections == 0


@pytest.mark.slow
def test_a_hub_id_not_in_the_cache_exits_2_at_once_naming_it(procs: Procs, tmp_path: Path) -> None:
    """An empty HF_HOME, no offline mode, no network reach: exit 2 before torch is imported, with no
    network attempt (transformers' retries took ~55 s), saying how to fill the cache."""
    with NetworkTrap() as trap:
        env = {"HF_HOME": str(tmp_path / "empty"), **trap.env}
        rc, proc = procs.run(
            ["worker", "--redis-url", UNREACHABLE, "--namespace", "t-never", "--tokenizer", "acme/not-here"],
            env=env,
            timeout=60,
        )
    err = proc.stderr()
    assert rc == 2, err[-2000:]
    assert "acme/not-here" in err and "not in the local Hugging Face cache" in err and "HF_HUB_OFFLINE" in err
    assert "hf download acme/not-here" in err and "huggingface-cli download acme/not-here" in err
    assert "--tokenizer" in err
    assert "importing torch" not in err  # refused before the slow imports
    assert trap.connections == 0


async def test_records_of_another_tokenizer_get_an_error_for_every_key(
    redis_url: str, ns: str, sync_redis: SyncClient, tmp_path: Path
) -> None:
    demo = load_tokenizer("builtin:demo")
    copy = tmp_path / "tokenizer.json"
    vocab = json.loads(DEMO_PATH.read_text())
    ids = vocab["model"]["vocab"]
    a, b = sorted(ids, key=ids.get)[200:202]
    ids[a], ids[b] = ids[b], ids[a]  # same size, two tokens swapped: another tokenizer
    copy.write_text(json.dumps(vocab))
    other = tokenizer_fingerprint(load_tokenizer(str(copy)))
    mine = tokenizer_fingerprint(demo)
    outputs = [text_output("turn one"), text_output("#### 42")]
    sample = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "42"}}
    async with running_workers(ns, redis_url, [build_manager("naive", tokenizer=demo)], tokenizer=demo) as workers:
        _check_fingerprint(workers[0])
        results: dict[str, tuple[dict[str, RewardResult], list[str]]] = {}
        for tag, fingerprint in (("other", other), ("mine", mine), ("none", None)):
            async with AsyncRewardClient.from_url(redis_url, namespace=ns, tokenizer=fingerprint) as client:
                keys = await client.put_trajectory(f"u-{tag}", "s1", outputs, sample)
                results[tag] = (await client.wait_rewards(keys, timeout=30), keys)
    wrong, keys = results["other"]
    for key in keys:
        error = must(wrong[key].error)
        assert wrong[key].status == "error" and "wrong tokenizer" in error
        assert must(other) in error and must(mine) in error
    for tag in ("mine", "none"):
        got, keys = results[tag]
        assert got[keys[-1]].ok and got[keys[-1]].reward_score == 1.0, tag
    dead = sync_redis.xrange(Keyspace(ns).dead(0))
    assert len(dead) == 2 and {fields[b"kind"] for _, fields in dead} == {b"tokenizer"}  # both outputs, no others


def _check_fingerprint(worker: Worker) -> None:
    parts = worker.rounds.parts
    assert parts.tokenizer_fingerprint == tokenizer_fingerprint(parts.tokenizer)
