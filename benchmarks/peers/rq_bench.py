"""RQ with its ``SimpleWorker`` (jobs run in the worker process, no fork per job).

Worker: ``rq worker -w rq.worker.SimpleWorker --logging_level WARNING
--disable-job-desc-logging``: the in-process worker RQ recommends when the fork per job is
not wanted, without the per-job log lines. Serializer: RQ's default (pickle), so token ids
travel as bytes. The backlog is written with ``Queue.enqueue_many`` in one pipeline and
``result_ttl=0`` (no result kept); latency jobs keep their result and the client waits with
``Job.latest_result(timeout=...)`` (a blocking ``XREAD`` on the job's result stream).

RQ's keys start with ``rq:``; every job id, the queue and the worker name carry this run's
prefix, so clean-up matches ``rq:*<prefix>*``, removes the two registry set members and
the maintenance lock ``rq:clean_groups`` the worker takes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from benchmarks.common import Cleanup, Row, Settings
from benchmarks.peers import base
from benchmarks.peers.tasks import score_and_write


def score(payload: dict[str, Any]) -> dict[str, Any]:
    """The RQ job function (imported by the worker as ``benchmarks.peers.rq_bench.score``)."""
    return score_and_write(payload)


class RQPeer(base.Peer):
    name = "rq"
    settings_note = "SimpleWorker, WARNING logs, pickle (bytes native)"
    wait_note = "Job.latest_result (XREAD BLOCK)"

    def __init__(self, s: Settings) -> None:
        super().__init__(s)
        from rq import Queue

        self.r = redis.Redis.from_url(s.redis_url, socket_connect_timeout=5)  # rq takes redis-py's own client
        self.queue = Queue(self.prefix, connection=self.r)
        self.worker_name = f"{self.prefix}-w"

    def worker_cmd(self) -> list[str]:
        from benchmarks.common import PYTHON

        return [
            PYTHON,
            "-m",
            "rq.cli",
            "worker",
            "-w",
            "rq.worker.SimpleWorker",
            "--url",
            self.s.redis_url,
            "--logging_level",
            "WARNING",
            "--disable-job-desc-logging",
            "-n",
            self.worker_name,
            self.prefix,
        ]

    def enqueue_many(self, payloads: Iterable[dict[str, Any]]) -> None:
        from rq import Queue

        batch = []
        for p in payloads:
            batch.append(Queue.prepare_data(score, (p,), job_id=self.job_id(), result_ttl=0))
            if len(batch) >= 500:
                self._flush(batch)
                batch = []
        if batch:
            self._flush(batch)

    def _flush(self, batch: list[Any]) -> None:
        with self.r.pipeline() as pipe:
            self.queue.enqueue_many(batch, pipeline=pipe)
            pipe.execute()

    def call(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        job = self.queue.enqueue(score, payload, job_id=self.job_id(), result_ttl=60)
        res = job.latest_result(timeout=max(1, int(timeout)))
        if res is None or res.return_value is None:
            raise TimeoutError(f"rq: no result for {job.id} ({None if res is None else res.type})")
        result: dict[str, Any] = res.return_value
        return result

    def patterns(self) -> list[str]:
        return [f"{self.prefix}*", f"rq:*{self.prefix}*"]

    def finish(self) -> None:
        self.r.srem("rq:queues", f"rq:queue:{self.prefix}")
        self.r.srem("rq:workers", f"rq:worker:{self.worker_name}")
        self.r.delete("rq:clean_groups")  # the maintenance lock our worker took (it has a TTL anyway)
        self.r.close()


def run(s: Settings, cleanup: Cleanup) -> list[Row]:
    return base.run(RQPeer(s), cleanup)
