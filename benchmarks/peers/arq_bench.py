"""arq (asyncio) with tuned ``max_jobs`` and ``poll_delay``.

Worker (``python -m benchmarks.peers.arq_bench``, which calls ``arq.run_worker`` with
:class:`WorkerSettings`): ``max_jobs=64`` and ``poll_delay=0.01`` s instead of 10 and 0.5 s,
the tuning arq's docs point at for many short jobs; logs at WARNING (no line per job). The
job is an ``async def`` that scores inline (the work is CPU-bound, a thread hop would only
add cost) and writes the rewards with arq's own Redis connection. Serializer: arq's
default (pickle), so token ids travel as bytes. arq keeps results per worker setting
(``keep_result``, default 3600 s) and cannot turn them off per job, so its throughput jobs
also store a result. Latency: ``Job.result(poll_delay=0.001)`` (arq polls).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from benchmarks.common import Cleanup, Row, Settings
from benchmarks.peers import base
from benchmarks.peers.tasks import env, write
from benchmarks.peers.tasks import score as score_payload


async def score(ctx: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    keys, s = score_payload(payload)
    await write(ctx["redis"].pipeline(transaction=False), env()[1], keys, s).execute()
    return {k: s for k in keys}


def _settings() -> type:
    from arq.connections import RedisSettings
    from arq.worker import func

    url, prefix = env()

    class WorkerSettings:
        functions = [func(score, name="score")]
        redis_settings = RedisSettings.from_dsn(url)
        queue_name = f"{prefix}:queue"
        max_jobs = 64
        poll_delay = 0.01
        keep_result = 300
        job_timeout = 60
        max_tries = 1

    return WorkerSettings


class ArqPeer(base.Peer):
    name = "arq"
    settings_note = "max_jobs 64, poll_delay 10 ms, results kept, pickle (bytes native)"
    wait_note = "Job.result(poll_delay=1 ms)"

    def __init__(self, s: Settings) -> None:
        super().__init__(s)
        self.loop = asyncio.new_event_loop()
        self.queue = f"{self.prefix}:queue"
        self.pool: Any = self.loop.run_until_complete(self._pool())

    async def _pool(self) -> Any:
        from arq import create_pool
        from arq.connections import RedisSettings

        return await create_pool(RedisSettings.from_dsn(self.s.redis_url), default_queue_name=self.queue)

    def worker_cmd(self) -> list[str]:
        from benchmarks.common import PYTHON

        return [PYTHON, "-m", "benchmarks.peers.arq_bench"]

    def enqueue_many(self, payloads: Iterable[dict[str, Any]]) -> None:
        async def go() -> None:
            for p in payloads:
                await self.pool.enqueue_job("score", p, _job_id=self.job_id())

        self.loop.run_until_complete(go())

    def call(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            job = await self.pool.enqueue_job("score", payload, _job_id=self.job_id())
            result: dict[str, Any] = await job.result(timeout=timeout, poll_delay=0.001)
            return result

        return self.loop.run_until_complete(go())

    def patterns(self) -> list[str]:
        return [f"{self.prefix}*", f"arq:*{self.prefix}*"]

    def finish(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()


def run(s: Settings, cleanup: Cleanup) -> list[Row]:
    return base.run(ArqPeer(s), cleanup)


def main() -> None:
    from arq import run_worker

    logging.basicConfig(level=logging.WARNING)
    run_worker(_settings())


if __name__ == "__main__":
    main()
