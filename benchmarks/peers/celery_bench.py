"""Celery 5 with the Redis broker and result backend.

Worker: ``celery worker -P solo --prefetch-multiplier 64 --without-gossip --without-mingle
--without-heartbeat -l WARNING``: the solo pool (no child process, the fastest pool for
short CPU-bound tasks in one process), a deep prefetch for many short tasks, early ack (the
default). Serializer: msgpack (Celery's built-in binary serializer), so token ids travel as
bytes; JSON would base64 them. Every key carries the run's prefix through kombu's
``global_keyprefix`` (broker and result backend). Throughput jobs are sent with
``ignore_result=True``; latency jobs store their result and the client waits with
``AsyncResult.get()`` (Redis pub/sub).

This module is also the app the worker imports (``celery -A benchmarks.peers.celery_bench``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery import Celery

from benchmarks.common import PYTHON, Cleanup, Row, Settings
from benchmarks.peers import base
from benchmarks.peers.tasks import env, score_and_write

URL, PREFIX = env()
app = Celery("rqbench", broker=URL, backend=URL, set_as_current=False)
app.conf.update(
    task_serializer="msgpack",
    result_serializer="msgpack",
    accept_content=["msgpack"],
    broker_transport_options={"global_keyprefix": f"{PREFIX}:"},
    result_backend_transport_options={"global_keyprefix": f"{PREFIX}:"},
    task_default_queue="score",
    worker_prefetch_multiplier=64,
    result_expires=300,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="rqbench.score")
def score(payload: dict[str, Any]) -> dict[str, Any]:
    return score_and_write(payload)


class CeleryPeer(base.Peer):
    name = "celery"
    settings_note = "solo pool, prefetch 64, msgpack (bytes native)"
    wait_note = "AsyncResult.get (pub/sub)"

    def __init__(self, s: Settings) -> None:
        super().__init__(s)
        self.app = Celery("rqbench-client", broker=s.redis_url, backend=s.redis_url, set_as_current=False)
        self.app.conf.update(app.conf)
        self.app.conf.update(
            broker_transport_options={"global_keyprefix": f"{self.prefix}:"},
            result_backend_transport_options={"global_keyprefix": f"{self.prefix}:"},
        )
        self.task = self.app.signature("rqbench.score")

    def worker_cmd(self) -> list[str]:
        return [
            PYTHON,
            "-m",
            "celery",
            "-A",
            "benchmarks.peers.celery_bench",
            "worker",
            "-P",
            "solo",
            "--prefetch-multiplier",
            "64",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "WARNING",
            "-Q",
            "score",
            "-n",
            f"{self.prefix}@%h",
        ]

    def enqueue_many(self, payloads: Iterable[dict[str, Any]]) -> None:
        with self.app.producer_or_acquire() as producer:
            for p in payloads:
                self.task.apply_async((p,), ignore_result=True, producer=producer)

    def call(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        result: dict[str, Any] = self.task.apply_async((payload,)).get(timeout=timeout)
        return result

    def finish(self) -> None:
        self.app.close()


def run(s: Settings, cleanup: Cleanup) -> list[Row]:
    import redis

    have = tuple(int(x) for x in redis.__version__.split(".")[:2])
    if have < (6, 1):  # kombu >= 5.6 refuses older redis-py at connect time
        return [
            Row(
                "celery",
                "throughput",
                status=f"not runnable: kombu's Redis transport needs redis-py>=6.1, "
                f"this environment has {redis.__version__} (arq pins redis<6)",
                note="run with a redis-py>=6.1 on PYTHONPATH, see docs/performance.md",
            )
        ]
    return base.run(CeleryPeer(s), cleanup)
