"""Run the rewardq fleet on a Ray cluster: ``rewardq worker`` processes as Ray actors.

::

    import ray
    from rewardq.integrations.ray import start_fleet

    ray.init()  # or the trainer's cluster, already initialised
    fleet = start_fleet(workers=16, config="trainer.yaml", namespace="run-42",
                        num_cpus=2, resources={"cpu_node": 1})
    fleet.status()   # every worker's state, pid, node, rate, in flight; the backlog and its drain time
    fleet.scale(4)   # graceful: the removed workers finish what they hold first
    fleet.stop()     # SIGTERM to every worker, each finishing within shutdown_grace

Each worker is one :class:`FleetWorker` actor (``num_cpus`` and custom ``resources`` per worker,
so Ray places them on CPU nodes; ``max_restarts=-1``) that runs one ``python -m rewardq worker``
process and watches it:

* the worker process reads the same config everywhere: the ``config`` given to
  :func:`start_fleet` (a :class:`~rewardq.config.WorkerConfig`, a mapping of its fields or verl's
  whole trainer config, or a YAML/JSON file read on the driver) travels with the actor as JSON;
  ``REWARDQ_*`` variables of the driver travel too. It is checked on the driver first, so a bad
  setting fails :func:`start_fleet` once instead of N workers;
* when the worker process dies (a crash, an OOM kill, a SIGKILL), the actor exits so that Ray
  restarts it, and the new actor starts a new worker process; when the actor's own process ends
  (killed, or with its owner's job), the worker's guardian (:mod:`rewardq.integrations.ray.guardian`,
  no descendant of the actor, so Ray's SIGKILL of an actor's children cannot reach it) sends the
  worker SIGTERM and it stops gracefully. Nothing is lost either way: the dead worker's entries
  are reclaimed by live workers after ``claim_idle`` seconds (docs/recovery.md);
* a worker process that exits with code 2 (a configuration error, which no restart fixes) is
  not restarted: its actor stays up and reports the error and the tail of its log;
* stopping (``scale`` down, :meth:`RayFleet.stop`, or the driver exiting) sends SIGTERM: the
  worker stops reading, finishes its in-flight trajectories within ``shutdown_grace`` and hands
  back the rest; after ``shutdown_grace`` + 10 s the process group is killed.

A worker's output goes to ``<Ray temp dir>/rewardq/<worker name>.log`` on its node (the path is in
:meth:`RayFleet.status`), not to the driver's console. Needs ``pip install 'rewardq[ray]'`` on the
driver and ``rewardq[worker,ray]`` (plus whatever the managers need) on the nodes.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ray

from rewardq.errors import ConfigError
from rewardq.integrations.ray.actor import STOP_SLACK, FleetError, FleetWorker
from rewardq.integrations.ray.autoscale import Autoscale, Autoscaler

if TYPE_CHECKING:
    from rewardq.queue.clients import SyncRedis
    from rewardq.queue.keys import Keyspace

__all__ = ["Autoscale", "FleetError", "FleetWorker", "RayFleet", "start_fleet"]

#: Workers ``start_fleet`` starts when told no number.
FLEET_WORKERS = 16
#: CPUs Ray reserves for each worker actor (a worker is one scoring process plus its scorers).
FLEET_NUM_CPUS = 1.0
#: Seconds ``start_fleet`` waits for its workers to report in before it raises.
FLEET_START_TIMEOUT = 300.0


logger = logging.getLogger("rewardq.fleet")


def _config_values(config: object) -> dict[str, Any]:
    """The mapping the workers read as their ``--config`` file, from what ``start_fleet`` was given."""
    from rewardq.config import WorkerConfig
    from rewardq.config_file import parse_file
    from rewardq.settings import settings_of

    if config is None:
        return {}
    if isinstance(config, WorkerConfig):
        return {name: getattr(config, name) for name in settings_of(WorkerConfig)}
    if isinstance(config, (str, os.PathLike)):
        return parse_file(os.fspath(config))
    if hasattr(config, "_metadata") and hasattr(config, "_get_node"):  # an OmegaConf DictConfig (verl's config)
        from omegaconf import OmegaConf

        try:
            return dict(OmegaConf.to_container(config, resolve=True))
        except Exception:  # noqa: BLE001 - an interpolation that does not resolve here: the worker reads it as written
            return dict(OmegaConf.to_container(config, resolve=False))
    if isinstance(config, Mapping):
        plain: dict[str, Any] = json.loads(json.dumps(config, default=str))
        return plain
    raise ConfigError(
        f"start_fleet: config must be a WorkerConfig, a mapping or a file path, got {type(config).__name__}"
    )


def _checked(values: Mapping[str, object], flags: Mapping[str, object]) -> Any:
    """The WorkerConfig every worker will run with (the driver's environment applies, as it will there)."""
    from rewardq.config import WorkerConfig

    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="rewardq-fleet-", delete=False) as f:
        json.dump(values, f)
    try:
        return WorkerConfig.load(config_file=f.name, overrides=flags)
    finally:
        os.unlink(f.name)


def _flags(overrides: Mapping[str, object]) -> list[str]:
    """``rewardq worker`` arguments for the settings ``start_fleet`` took as parameters."""
    from rewardq.config import WorkerConfig
    from rewardq.settings import flag_argv

    return flag_argv(WorkerConfig, overrides)


class RayFleet:
    """A running fleet of rewardq workers on Ray (what :func:`start_fleet` returns).

    ``status()`` reports, ``scale(n)`` grows or shrinks it, ``stop()`` ends it; ``with`` stops it
    on exit, and so does the driver's exit. Thread-safe.
    """

    def __init__(
        self,
        *,
        cfg: Any,
        config: Mapping[str, object],
        flags: list[str],
        env: dict[str, str],
        prefix: str,
        actor_options: Mapping[str, object],
        autoscale: Autoscale | None = None,
    ) -> None:
        self.cfg = cfg
        self.namespace: str = cfg.namespace
        self.prefix = prefix
        self._config, self._flags, self._env = config, flags, env
        self._options = actor_options
        self._grace = float(cfg.shutdown_grace) + STOP_SLACK
        self._actors: list[Any] = []
        self._seen: dict[int, tuple[int | None, str]] = {}  # index -> (actor pid, name) last seen
        self._restarts: dict[int, int] = {}
        self._lock = threading.RLock()
        self._client: SyncRedis | None = None
        self._ks: Keyspace | None = None
        self.stopped = False
        self.autoscaler = Autoscaler(autoscale) if autoscale is not None else None
        self._autoscale_stop = threading.Event()
        self._autoscale_thread: threading.Thread | None = None
        atexit.register(self._at_exit)

    # -- life cycle ------------------------------------------------------------------------
    def scale(self, n: int, *, wait: bool = True, timeout: float | None = None) -> None:
        """Have ``n`` workers: start the missing ones (and, with ``wait``, wait until they beat), or
        stop the newest ones gracefully (each finishes its in-flight trajectories first)."""
        if n < 0:
            raise ConfigError(f"scale: the number of workers must be >= 0, got {n}")
        with self._lock:
            if self.stopped:
                raise FleetError(f"fleet {self.prefix} on namespace {self.namespace!r} is stopped")
            have = len(self._actors)
            if n > have:
                actor_cls = ray.remote(FleetWorker)
                for i in range(have, n):
                    port = self.cfg.metrics_port  # worker i serves on port + i: two on one node never collide
                    spec = {
                        "index": i,
                        "prefix": self.prefix,
                        "config": self._config,
                        "flags": [*self._flags, *(["--metrics-port", str(port + i)] if port else [])],
                        "env": self._env,
                        "grace": self._grace,
                    }
                    self._actors.append(actor_cls.options(**self._options).remote(spec))
                logger.info("fleet %s: started workers %d..%d", self.prefix, have, n - 1)
            elif n < have:
                leaving, self._actors = self._actors[n:], self._actors[:n]
                self._stop_actors(leaving)
                for i in range(n, have):
                    self._seen.pop(i, None)
                logger.info("fleet %s: stopped workers %d..%d", self.prefix, n, have - 1)
        if wait and n > have:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait until every worker's heartbeat is in Redis; returns :meth:`status`.

        Raises:
            FleetError: a worker exited with a configuration error (its log tail is in the
                message), or ``timeout`` (default 300 s) passed first (the message says which
                workers are not ready and where their logs are).
        """
        deadline = time.monotonic() + (300.0 if timeout is None else timeout)
        while True:
            st = self.status()
            failed = [w for w in st["workers"] if w["state"] == "failed"]
            if failed:
                w = failed[0]
                raise FleetError(
                    f"fleet worker {w['name']} exited with a configuration error (code {w['exit_code']}); "
                    f"its log ({w['log']} on {w['node_ip']}) ends with:\n{w.get('log_tail', '')}"
                )
            if all(w["alive"] for w in st["workers"]):
                return st
            if time.monotonic() > deadline:
                waiting = [f"{w['name'] or w['index']} ({w['state']}, log {w['log']})" for w in st["workers"]]
                raise FleetError(
                    f"fleet {self.prefix}: not every worker beat within the timeout; not ready: {', '.join(waiting)}. "
                    "Check that the cluster has the resources asked for (num_cpus, resources) and the logs"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop every worker gracefully (SIGTERM; each gets ``shutdown_grace`` + 10 s). Safe to call twice."""
        self._autoscale_stop.set()
        if self._autoscale_thread is not None and self._autoscale_thread is not threading.current_thread():
            self._autoscale_thread.join(30)
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
            actors, self._actors = self._actors, []
            self._stop_actors(actors)
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.close()
        with contextlib.suppress(Exception):
            atexit.unregister(self._at_exit)
        logger.info("fleet %s on namespace %r stopped", self.prefix, self.namespace)

    def _stop_actors(self, actors: list[Any]) -> None:
        """Stop these actors' workers gracefully (in parallel), then end the actors."""
        placed = [a for a in actors if self._answered(a)]
        refs = [a.stop.remote() for a in placed]
        if refs:
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=self._grace + 15)
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)

    def _answered(self, actor: Any) -> bool:
        """Whether ``actor`` runs (was placed and answers); an actor still waiting for resources does not."""
        try:
            ray.get(actor.info.remote(), timeout=2)
            return True
        except Exception:  # noqa: BLE001 - not placed, restarting or dead: nothing to stop gracefully
            return False

    def _at_exit(self) -> None:
        if not self.stopped and ray.is_initialized():
            with contextlib.suppress(Exception):
                self.stop()

    def __enter__(self) -> RayFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what is running -------------------------------------------------------------------
    def _redis(self) -> tuple[SyncRedis, Keyspace]:
        from rewardq.queue.connection import connect_sync
        from rewardq.queue.keys import Keyspace
        from rewardq.queue.meta import known_shards

        if self._client is None:
            self._client = connect_sync(self.cfg.redis_url, cluster=self.cfg.cluster)
        if self._ks is None or self._ks.shards == 1:  # a new namespace gets its shard count from the workers
            self._ks = Keyspace(self.namespace, known_shards(self._client, self.namespace) or 1, self.cfg.group)
        return self._client, self._ks

    def _infos(self, actors: list[Any]) -> list[dict[str, object] | None]:
        refs = [a.info.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=5) if refs else ([], [])
        done = set(ready)
        out: list[dict[str, Any] | None] = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=0) if ref in done else None)
            except Exception:  # noqa: BLE001 - an actor that is restarting answers with an error
                out.append(None)
        return out

    def status(self) -> dict[str, Any]:
        """The fleet now, as one JSON-able dict.

        ``workers``: one entry per slot (``index``, ``name``, ``state`` — starting, running, died,
        failed, restarting, stopped —, ``alive`` (its heartbeat is fresh), ``pid`` of the worker
        process, ``actor_pid``, ``host``, ``node_ip``, ``restarts`` seen by this handle, ``log``,
        and from the heartbeat ``rate_per_s``, ``outputs_per_s``, ``in_flight``, ``scored``,
        ``errors``). ``backlog``: :func:`rewardq.queue.reads.backlog_status` for the namespace
        (entries waiting, outputs scored per second, ``seconds`` to drain); ``backlog_seconds``
        the same figure; ``autoscale``: the policy and its last decision, if any.
        """
        from rewardq.queue.reads import backlog_status, shard_status, workers_status

        with self._lock:
            actors = list(self._actors)
        infos = self._infos(actors)
        client, ks = self._redis()
        beats = {w["name"]: w for w in workers_status(client, ks)}
        shards = [shard_status(client, ks, s) for s in range(ks.shards)]
        slots = []
        for i, info in enumerate(infos):
            slot: dict[str, Any] = info or {
                "index": i,
                "name": None,
                "state": "restarting" if i in self._seen else "pending",  # pending: not placed yet
                "log": None,
            }
            slot.setdefault("node_ip", None)
            self._count_restart(i, slot)
            beat = beats.get(slot["name"] or "")
            slot["alive"] = beat is not None and beat["idle_s"] < max(10.0, 3 * self.cfg.heartbeat_interval)
            for key in ("rate_per_s", "outputs_per_s", "in_flight", "scored", "errors"):
                slot[key] = beat[key] if beat else None
            slots.append(slot)
        backlog = backlog_status(shards, list(beats.values()))
        out = {
            "namespace": self.namespace,
            "fleet": self.prefix,
            "target": len(actors),
            "alive": sum(1 for s in slots if s["alive"]),
            "stopped": self.stopped,
            "workers": slots,
            "backlog": backlog,
            "backlog_seconds": backlog["seconds"],
            "autoscale": None,
        }
        if self.autoscaler is not None:
            out["autoscale"] = {**dataclasses.asdict(self.autoscaler.policy), "last": self.autoscaler.last}
        return out

    def _count_restart(self, index: int, slot: dict[str, Any]) -> None:
        name = slot.get("name")
        if name is not None:
            before = self._seen.get(index)
            if before is not None and before[1] != name:
                self._restarts[index] = self._restarts.get(index, 0) + 1
            self._seen[index] = (slot.get("actor_pid"), name)
        slot["restarts"] = self._restarts.get(index, 0)

    # -- autoscaling ---------------------------------------------------------------------
    def start_autoscaling(self) -> None:
        """Run the autoscaling policy in a background thread until :meth:`stop`."""
        if self.autoscaler is None or self._autoscale_thread is not None:
            return
        self._autoscale_thread = threading.Thread(target=self._autoscale_loop, name="rewardq-autoscale", daemon=True)
        self._autoscale_thread.start()

    def autoscale_once(self) -> int:
        """One autoscaling decision, applied; returns the fleet size decided."""
        assert self.autoscaler is not None
        st = self.status()
        target = self.autoscaler.decide(time.monotonic(), st["target"], st["backlog"])
        if target != st["target"]:
            logger.info(
                "fleet %s: autoscaling %d -> %d workers (backlog %d entries, %.1f outputs/s, drain %s s)",
                self.prefix,
                st["target"],
                target,
                st["backlog"]["entries"],
                st["backlog"]["outputs_per_s"],
                st["backlog"]["seconds"],
            )
            self.scale(target, wait=False)
        return target

    def _autoscale_loop(self) -> None:
        assert self.autoscaler is not None
        while not self._autoscale_stop.wait(self.autoscaler.policy.interval_s):
            try:
                self.autoscale_once()
            except Exception:
                if self.stopped:
                    return
                logger.warning("fleet %s: autoscaling pass failed; retrying", self.prefix, exc_info=True)


def start_fleet(
    workers: int = FLEET_WORKERS,
    config: object = None,
    namespace: str | None = None,
    *,
    redis_url: str | None = None,
    num_cpus: float = FLEET_NUM_CPUS,
    memory: int | None = None,
    resources: Mapping[str, float] | None = None,
    env: Mapping[str, str] | None = None,
    runtime_env: Mapping[str, object] | None = None,
    name: str | None = None,
    autoscale: Autoscale | Mapping[str, object] | None = None,
    wait: bool = True,
    timeout: float | None = FLEET_START_TIMEOUT,
) -> RayFleet:
    """Start ``workers`` rewardq workers as Ray actors and return the fleet's handle.

    Args:
        workers: how many worker processes (with ``autoscale``: how many to start with, kept
            within its bounds).
        config: what every worker runs with: a :class:`~rewardq.config.WorkerConfig`, a mapping
            of its fields or verl's trainer config (a dict or an OmegaConf config), or a YAML/JSON
            file path read here on the driver.
        namespace, redis_url: override the config's ``namespace`` / ``redis_url``.
        num_cpus, memory, resources: what Ray reserves for each worker, e.g.
            ``resources={"cpu_node": 1}`` to keep workers off GPU nodes.
        env: extra environment variables for the worker processes (the driver's ``REWARDQ_*``
            variables are passed along already).
        runtime_env: Ray runtime environment of the actors.
        name: worker names are ``<name>-<index>-<4 hex>`` (default ``<namespace>-fleet``).
        autoscale: an :class:`Autoscale` policy (or its fields as a mapping): the handle resizes
            the fleet from the backlog's drain time in a background thread.
        wait: wait until every worker's heartbeat is in Redis (``timeout`` seconds).

    Raises:
        ConfigError: the config is invalid (checked on the driver before any actor starts).
        FleetError: a worker exited with a configuration error, or not all became ready in time
            (the fleet is stopped first).
    """
    if workers < 0:
        raise ConfigError(f"start_fleet: workers must be >= 0, got {workers}")
    if not ray.is_initialized():
        ray.init()
    policy = Autoscale.from_mapping(autoscale) if isinstance(autoscale, Mapping) else autoscale
    overrides = {k: v for k, v in {"namespace": namespace, "redis_url": redis_url}.items() if v is not None}
    values = _config_values(config)
    cfg = _checked(values, overrides)
    if policy is not None:
        workers = max(policy.min_workers, min(policy.max_workers, workers))
    flags = _flags(overrides)
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": -1, "max_task_retries": 0, "max_concurrency": 4}
    if memory is not None:
        options["memory"] = memory
    if resources:
        options["resources"] = dict(resources)
    if runtime_env:
        options["runtime_env"] = dict(runtime_env)
    passed = {k: v for k, v in os.environ.items() if k.startswith("REWARDQ_")}
    fleet = RayFleet(
        cfg=cfg,
        config=values,
        flags=flags,
        env={**passed, **dict(env or {})},
        prefix=name or f"{cfg.namespace}-fleet",
        actor_options=options,
        autoscale=policy,
    )
    try:
        fleet.scale(workers, wait=wait, timeout=timeout)
    except BaseException:
        fleet.stop()
        raise
    fleet.start_autoscaling()
    return fleet
