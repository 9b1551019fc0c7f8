"""``reward.rewardq.fleet`` in a verl config: the adapter starts the Ray fleet on the trainer's cluster.

With the key ``reward.rewardq.fleet.workers: N`` (or ``rewardq.fleet.workers``), the first
trajectory an adapter process scores starts ``N`` workers on the trainer's own Ray cluster
(:func:`rewardq.integrations.ray.start_fleet`), unless a worker of the namespace is already alive
or another process is starting them. The workers read the same verl config; the fleet's actors
belong to the process that started them, so they end with the trainer's job (each worker stops
gracefully). Without the key nothing is started, as before.

The block's keys are ``start_fleet``'s: ``workers``, ``num_cpus``, ``memory``, ``resources``,
``env``, ``autoscale`` (``{min_workers, max_workers, target_drain_s, ...}``), ``name`` and
``timeout`` (seconds to wait for the workers, 300 by default).

Of the many processes that score (verl's agent-loop workers or reward-loop workers), the one that
takes ``<ns>:lock:fleet`` starts the fleet; the others go on pushing, and their trajectories wait
in the streams until the workers are up. In the starting process, every trajectory scored while
the fleet starts waits for it, and a fleet that cannot start (a bad setting, resources the
cluster lacks) fails them with the reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Mapping
from typing import Any

from rewardq.errors import ConfigError

__all__ = ["FLEET_KEYS", "fleet_request", "ensure_fleet", "ensure_fleet_once"]

logger = logging.getLogger("rewardq.fleet")

#: The keys of a ``reward.rewardq.fleet`` block (``start_fleet``'s parameters).
FLEET_KEYS = frozenset({"workers", "num_cpus", "memory", "resources", "env", "autoscale", "name", "timeout"})
#: Seconds the start lock lives at most (a starter that dies frees it then).
LOCK_TTL = 600.0
#: A worker whose heartbeat is younger than this counts as alive.
ALIVE_S = 10.0

_guard = threading.Lock()
_starts: dict[tuple[str, str], concurrent.futures.Future[Any]] = {}  # (redis url, namespace) -> the start
_seen: dict[int, tuple[Any, concurrent.futures.Future[Any] | None]] = {}  # id(config) -> (config, its start)


def fleet_request(config: object) -> dict[str, Any] | None:
    """The ``fleet`` block of a verl config's ``reward.rewardq`` (or ``rewardq``), or None when it has
    no ``workers`` key. Raises ConfigError naming an unknown key or a bad worker count."""
    from rewardq.integrations.verl.settings import config_at

    for path in ("reward.rewardq.fleet", "rewardq.fleet"):
        block = config_at(config, path)
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise ConfigError(f"the verl config's {path} must be a mapping (workers, num_cpus, ...), got {block!r:.80}")
        unknown = sorted(set(map(str, block)) - FLEET_KEYS)
        if unknown:
            raise ConfigError(f"the verl config's {path} has unknown key(s) {unknown}; known: {sorted(FLEET_KEYS)}")
        if block.get("workers") is None:
            return None
        workers = block["workers"]
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ConfigError(f"the verl config's {path}.workers must be a whole number >= 0, got {workers!r}")
        return dict(block)
    return None


def ensure_fleet(config: object, settings: Any) -> Any:
    """Start the fleet ``config`` asks for, unless workers of ``settings.namespace`` are alive or another
    process holds the start lock; returns the started :class:`~rewardq.integrations.ray.RayFleet` or None.
    Blocks until the workers beat (or raises ConfigError / FleetError)."""
    request = fleet_request(config)
    if request is None:
        return None
    from rewardq.integrations.ray.fleet import start_fleet
    from rewardq.queue.connection import connect_sync
    from rewardq.queue.keys import Keyspace
    from rewardq.queue.meta import known_shards, try_lock
    from rewardq.queue.reads import workers_status

    client = connect_sync(settings.redis_url, cluster=settings.cluster)
    try:
        ks = Keyspace(settings.namespace, known_shards(client, settings.namespace) or 1)
        alive = [w["name"] for w in workers_status(client, ks) if w["idle_s"] < ALIVE_S]
        if alive:
            logger.info("fleet: %d worker(s) of namespace %r alive; none started", len(alive), settings.namespace)
            return None
        lock = try_lock(client, ks, "fleet", LOCK_TTL)
        if lock is None:
            logger.info("fleet: another process is starting namespace %r's fleet", settings.namespace)
            return None
        try:
            options = {k: v for k, v in request.items() if k != "workers"}
            logger.info("fleet: starting %d workers on namespace %r", request["workers"], settings.namespace)
            return start_fleet(request["workers"], config, settings.namespace, redis_url=settings.redis_url, **options)
        finally:
            with contextlib.suppress(Exception):  # expired meanwhile: nothing to free
                lock.release()
    finally:
        client.close()


def _start(config: object) -> concurrent.futures.Future[Any] | None:
    """The (shared) start of ``config``'s fleet, in a thread of its own; None without a fleet key."""
    from rewardq.integrations.verl.settings import settings_for

    if fleet_request(config) is None:
        return None
    settings = settings_for(config)
    key = (settings.redis_url, settings.namespace)
    with _guard:
        fut = _starts.get(key)
        if fut is None:
            fut = _starts[key] = concurrent.futures.Future()

            def run() -> None:
                try:
                    fut.set_result(ensure_fleet(config, settings))  # the result keeps the fleet's actors alive
                except BaseException as exc:  # noqa: BLE001 - handed to every caller of ensure_fleet_once
                    fut.set_exception(exc)

            threading.Thread(target=run, name="rewardq-fleet-start", daemon=True).start()
    return fut


async def ensure_fleet_once(config: object) -> None:
    """The adapter's hook, awaited before each trajectory is pushed: on the first one of a config that
    asks for a fleet, start it (once per process and namespace); afterwards it costs a dict lookup."""
    if config is None:
        return
    seen = _seen.get(id(config))
    if seen is None or seen[0] is not config:
        fut = _start(config)
        _seen[id(config)] = (config, fut)
    else:
        fut = seen[1]
    if fut is not None:
        await asyncio.wrap_future(fut)
