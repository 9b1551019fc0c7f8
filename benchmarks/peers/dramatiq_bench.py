"""Dramatiq with the Redis broker.

Worker: ``dramatiq benchmarks.peers.dramatiq_bench --processes 1 --threads 8``: one worker
process (what every system gets here) with Dramatiq's default 8 worker threads and its
default prefetch; the default middleware (no Prometheus) plus ``Results`` on a Redis
backend. Serializer: Dramatiq's default JSON encoder, so token ids travel base64-encoded in
JSON strings (what a Dramatiq user does with bytes; its pickle encoder is discouraged) and
the job decodes them. Throughput messages are sent with ``store_results=False``; latency
messages with ``store_results=True``, and the client waits with
``Message.get_result(block=True)`` (a blocking ``BRPOPLPUSH``).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends.redis import RedisBackend

from benchmarks.common import PYTHON, Cleanup, Row, Settings
from benchmarks.peers import base
from benchmarks.peers.tasks import env, score_and_write
from benchmarks.workload import Trajectory

URL, PREFIX = env()
broker = RedisBroker(url=URL, namespace=PREFIX)
backend = RedisBackend(url=URL, namespace=f"{PREFIX}-results")
broker.add_middleware(Results(backend=backend, store_results=False, result_ttl=300_000))
dramatiq.set_broker(broker)

_BYTES = ("prompt_ids", "response_ids", "response_mask")


def to_json(payload: dict[str, Any]) -> dict[str, Any]:
    """The job payload with its token-id bytes as base64 text (JSON has no bytes)."""
    return {
        **payload,
        "outputs": [{**o, **{k: base64.b64encode(o[k]).decode("ascii") for k in _BYTES}} for o in payload["outputs"]],
    }


def from_json(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "outputs": [{**o, **{k: base64.b64decode(o[k]) for k in _BYTES}} for o in payload["outputs"]]}


@dramatiq.actor(actor_name="rqbench_score", queue_name="score", max_retries=0, time_limit=60_000)
def score(payload: dict[str, Any]) -> dict[str, Any]:
    return score_and_write(from_json(payload))


class DramatiqPeer(base.Peer):
    name = "dramatiq"
    settings_note = "1 process x 8 threads, Results middleware, JSON + base64 ids"
    wait_note = "Message.get_result(block=True) (BRPOPLPUSH)"

    def __init__(self, s: Settings) -> None:
        super().__init__(s)
        self.broker = RedisBroker(url=s.redis_url, namespace=self.prefix)
        self.backend = RedisBackend(url=s.redis_url, namespace=f"{self.prefix}-results")
        self.broker.add_middleware(Results(backend=self.backend, store_results=False, result_ttl=300_000))
        self.actor = dramatiq.Actor(
            score.fn,
            broker=self.broker,
            actor_name="rqbench_score",
            queue_name="score",
            priority=0,
            options={"max_retries": 0},
        )

    def payload(self, traj: Trajectory) -> dict[str, Any]:
        return to_json(traj.job_payload())

    def worker_cmd(self) -> list[str]:
        return [
            PYTHON,
            "-m",
            "dramatiq",
            "benchmarks.peers.dramatiq_bench",
            "--processes",
            "1",
            "--threads",
            "8",
            "--queues",
            "score",
        ]

    def enqueue_many(self, payloads: Iterable[dict[str, Any]]) -> None:
        for p in payloads:
            self.actor.send_with_options(args=(p,), store_results=False)

    def call(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        msg = self.actor.send_with_options(args=(payload,), store_results=True)
        result: dict[str, Any] = msg.get_result(backend=self.backend, block=True, timeout=int(timeout * 1000))
        return result

    def finish(self) -> None:
        self.broker.close()


def run(s: Settings, cleanup: Cleanup) -> list[Row]:
    return base.run(DramatiqPeer(s), cleanup)
