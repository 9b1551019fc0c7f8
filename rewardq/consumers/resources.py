"""What a worker opens when it starts and closes when it stops, besides its Redis client.

* :func:`open_broker`: agree on the shard count, build the :class:`StreamBroker`, create
  the consumer groups;
* :func:`serve_metrics`: the Prometheus endpoint of ``--metrics-port``;
* :func:`close_manager`: the manager, its context and its scorer processes, each failure logged.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rewardq.config import WorkerConfig
from rewardq.consumers.metrics import WorkerMetrics
from rewardq.queue.access import check_worker_access
from rewardq.queue.broker import StreamBroker
from rewardq.queue.connection import refusals_named
from rewardq.queue.keys import Keyspace
from rewardq.queue.meta import ensure_meta
from rewardq.queue.reads import fleet_backlog_async
from rewardq.reward.base import RewardManager

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

logger = logging.getLogger("rewardq.worker")


async def open_broker(client: AsyncRedis, cfg: WorkerConfig, worker_name: str) -> StreamBroker:
    """The worker's broker on the pipeline's shards, with every shard's consumer group created.

    A Redis user that lacks a permission the worker needs gets the error naming it, before anything
    is written (:func:`~rewardq.queue.access.check_worker_access`, :func:`refusals_named`).
    """
    probe = Keyspace(cfg.namespace, 1, cfg.group)
    with refusals_named(cfg.namespace, cfg.redis_url):
        await check_worker_access(client, probe, cfg.redis_url)
        shards = await ensure_meta(client, probe, cfg.shards)
        # the settings declared passed_to="broker" (result_ttl, lease_seconds, ...), by name
        broker = StreamBroker(
            client, Keyspace(cfg.namespace, shards, cfg.group), worker=worker_name, **cfg.arguments_for("broker")
        )
        await broker.ensure_groups()
    return broker


def code_stats(manager: RewardManager | None) -> Any:
    """The manager's code-execution counters (None for a manager without a context)."""
    return getattr(getattr(manager, "context", None), "code_stats", None)


def serve_metrics(
    cfg: WorkerConfig, manager: RewardManager, port: int, client: AsyncRedis, ks: Keyspace
) -> tuple[WorkerMetrics, int]:
    """The worker's metrics, served on ``port`` (0 picks one), with the namespace's backlog gauges
    refreshed every ``maintenance_interval`` through ``client``; returns them and the bound port."""
    stats = getattr(manager, "stats", None)
    code = code_stats(manager)
    judges = getattr(getattr(manager, "context", None), "judge_stats", None)
    served = WorkerMetrics(
        cfg.manager,
        limiter_stats=stats if callable(stats) else None,
        code_stats=code.snapshot if code is not None else None,
        judge_stats=judges.snapshot if judges is not None else None,
    )
    served.watch_backlog(lambda: fleet_backlog_async(client, ks), cfg.maintenance_interval)
    bound = served.serve(port)
    logger.info("metrics on http://0.0.0.0:%d/metrics", bound)
    return served, bound


async def close_manager(manager: RewardManager) -> None:
    """Close the manager and its context, then its scorer processes; failures are logged, not raised."""
    try:
        await manager.close()
        context = getattr(manager, "context", None)
        if context is not None:
            await context.aclose()
    except Exception:
        logger.exception("manager close failed")
    try:
        await manager.close_scoring()
    except Exception:
        logger.exception("closing the scorer processes failed")
