"""Which namespace ``rewardq replay --namespace NS`` may run in, and the mark it leaves there.

A replay's worker scores whatever trajectories reach its namespace, with the replay's scoring
configuration, and writes their results where that namespace's producers read them. So a named
namespace must be the replay's own: one nothing has used yet, or one carrying the mark of a replay
into the same ``--out`` with the same configuration (a stopped replay, resumed there: the keys it
left behind are its own, and the ones it scored are in ``--out``, so they are not sent again).

The mark is ``<ns>:replay`` (:attr:`~rewardq.queue.keys.Keyspace.replay`): the ``--out``'s own id
(its :data:`~rewardq.ledger.replay.RECORD`'s ``id``) and the scoring fingerprint, set once the
namespace is found unused, after the record is written and before anything is sent. Any other
namespace is refused (:func:`check_namespace`):

* live workers serve it: they would score the replay's trajectories into their own ledger;
* it carries another mark: a replay into another ``--out``, or with another configuration;
* something else used it: its ``meta`` (every producer and worker writes it), a stream, finished
  trajectories, worker heartbeats (a fleet whose workers are down for a moment still has all of
  those), or a result or trajectory of a key the replay would send.

Each check reads single keys, so it runs on Redis Cluster as on one Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rewardq.errors import ConfigError
from rewardq.ledger.replay import Trajectory
from rewardq.queue.keys import Keyspace

if TYPE_CHECKING:
    from rewardq.config import WorkerConfig
    from rewardq.queue.clients import SyncRedis


def replay_mark(out_id: str, scoring: str) -> str:
    """The value of ``<ns>:replay`` for a replay into the ``--out`` of id ``out_id`` scoring with
    fingerprint ``scoring``."""
    return json.dumps({"out": out_id, "scoring": scoring}, sort_keys=True)


@contextmanager
def _namespace(cfg: WorkerConfig) -> Iterator[tuple[SyncRedis, Keyspace]]:
    from rewardq.queue.connection import connect_sync
    from rewardq.queue.namespace import shard_count

    r = connect_sync(cfg.redis_url, cluster=cfg.cluster)
    try:
        ks = Keyspace(cfg.namespace)
        yield r, Keyspace(cfg.namespace, shard_count(r, ks) or ks.shards)
    finally:
        r.close()


def check_namespace(cfg: WorkerConfig, trajectories: Sequence[Trajectory], mark: str) -> None:
    """Refuse (ConfigError) ``cfg.namespace`` unless it is the replay's own (module doc): unused, or
    carrying ``mark``."""
    from rewardq.queue.reads import workers_status

    ns = cfg.namespace
    with _namespace(cfg) as (r, ks):
        live = [w["name"] for w in workers_status(r, ks)]
        if live:
            raise ConfigError(
                f"--namespace {ns} is served by {len(live)} live worker(s) ({', '.join(live[:3])}"
                f"{', ...' if len(live) > 3 else ''}): they would score the replay's trajectories instead of the "
                "replay; leave out --namespace (a replay makes a namespace of its own), or name an unused one"
            )
        found = _as_text(r.get(ks.replay))
        if found == mark:
            return  # a replay into this --out, with this configuration: resume there
        if found is not None:
            raise ConfigError(
                f"--namespace {ns} holds a replay into another --out or with another scoring configuration "
                f"({ks.replay} = {found}): its keys would be refused as conflicting records; leave out "
                "--namespace, or name an unused one"
            )
        used = _uses(r, ks)
        there = _keys_present(r, ks, trajectories)
        if there:
            used.append(f"results or trajectories of {there} of the trajectories to replay")
        if used:
            raise ConfigError(
                f"--namespace {ns} already holds {', '.join(used)}: it is another pipeline's (a fleet's, even "
                "with its workers down) or another ledger's replay, whose trajectories the replay's worker would "
                "score, and whose keys would be refused as conflicting records; leave out --namespace, or name "
                "an unused one"
            )


def mark_namespace(cfg: WorkerConfig, mark: str) -> None:
    """Set ``<ns>:replay`` to ``mark`` (after :func:`check_namespace`); refuse (ConfigError) if another
    replay marked the namespace meanwhile."""
    with _namespace(cfg) as (r, ks):
        if not r.set(ks.replay, mark, nx=True) and _as_text(r.get(ks.replay)) != mark:
            raise ConfigError(
                f"--namespace {cfg.namespace} was just taken by another replay ({ks.replay}); leave out "
                "--namespace, or name an unused one"
            )


def _uses(r: SyncRedis, ks: Keyspace) -> list[str]:
    """What in ``ks`` shows that a producer or worker used it (none for an unused namespace)."""
    named = [
        (ks.meta, "its meta (a producer or worker used it)"),
        (ks.workers, "worker heartbeats"),
        *((s, "stream entries or a consumer group") for s in ks.streams),
        *((ks.done(i), "finished trajectories") for i in range(ks.shards)),
    ]
    pipe = r.pipeline(transaction=False)
    for key, _ in named:
        pipe.exists(key)
    found = [what for (_, what), n in zip(named, pipe.execute(), strict=True) if n]
    return list(dict.fromkeys(found))


def _keys_present(r: SyncRedis, ks: Keyspace, trajectories: Sequence[Trajectory]) -> int:
    """How many of ``trajectories`` have a result (of their first key) or a trajectory hash in ``ks``."""
    found = 0
    for i in range(0, len(trajectories), 500):
        pipe = r.pipeline(transaction=False)
        for t in trajectories[i : i + 500]:
            pipe.exists(ks.reward_key(t.keys[0]), ks.traj_key(f"{t.uid}_{t.session_id}"))
        found += sum(1 for n in pipe.execute() if n)
    return found


def _as_text(raw: bytes | str | None) -> str | None:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
