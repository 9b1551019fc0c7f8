"""The task body every peer runs: the same scoring work and the same reward write as the others.

Worker processes of the peers import this (through their app modules); it reads its Redis
URL and key prefix from ``BENCH_REDIS_URL`` / ``BENCH_PREFIX`` when first used, because a
task-queue worker is configured through the module it imports.
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.workload import score_final_response, trivial_score

_redis: Any = None


def env() -> tuple[str, str]:
    return (
        os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
        os.environ.get("BENCH_PREFIX", "rqbench-peer"),
    )


def reward_key(prefix: str, key: str) -> str:
    return f"{prefix}:reward:{key}"


def done_key(prefix: str) -> str:
    return f"{prefix}:done"


def score(payload: dict[str, Any]) -> tuple[list[str], float]:
    """Decode + GSM8K-score the final output; returns the trajectory's keys and the score."""
    final = payload["outputs"][-1]
    if os.environ.get("BENCH_SCORER") == "trivial":
        s = trivial_score(len(final["response_ids"]) // 4)  # int32 little-endian bytes
    else:
        s = score_final_response(final["response_ids"], payload["sample"]["reward_model"]["ground_truth"])
    return [f"{payload['tid']}_{i}" for i in range(payload["n"])], s


def write(pipe: Any, prefix: str, keys: list[str], s: float) -> Any:
    """Queue the reward writes on ``pipe`` (caller executes): HSET per key, INCR done."""
    for k in keys:
        pipe.hset(reward_key(prefix, k), "score", s)
    pipe.incr(done_key(prefix))
    return pipe


def score_and_write(payload: dict[str, Any]) -> dict[str, float]:
    """The whole job for the synchronous peers: score, write every key, return the rewards."""
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(env()[0])
    keys, s = score(payload)
    write(_redis.pipeline(transaction=False), env()[1], keys, s).execute()
    return {k: s for k in keys}
