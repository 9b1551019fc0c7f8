"""Which namespace ``rewardq replay --namespace NS`` may run in, and the mark it leaves there.

A replay's worker scores whatever trajectories reach its namespace, with the replay's scoring
configuration, and writes their results where that namespace's producers read them. So a named
namespace must be the replay's own: one nothing has used yet, or one carrying the mark of a replay
into the same ``--out`` with the same configuration (a stopped replay, resumed there: the keys it
left behind are its own, and the ones it scored are in ``--out``, so they are not sent again).

The mark is ``<ns>:replay`` (:attr:`~rewardq.queue.keys.Keyspace.replay`,
:class:`~rewardq.queue.namespace.ReplayMark`): the ``--out``'s own id (its
:data:`~rewardq.ledger.replay.RECORD`'s ``id``), the scoring fingerprint and, for people, the
``--out`` itself, set once the
namespace is found unused, after the record is written and before anything is sent. Any other
namespace is refused (:func:`check_namespace`):

* live workers serve it: they would score the replay's trajectories into their own ledger;
* it carries another mark: a replay into another ``--out``, or with another configuration;
* something else used it: its ``meta`` (every producer and worker writes it), a stream, finished
  trajectories, worker heartbeats (a fleet whose workers are down for a moment still has all of
  those), or a result or trajectory of a key the replay would send.

The check and the mark are two steps, so :func:`mark_namespace` makes taking the namespace one
decision: it sets the mark with ``SET NX``, so of two replays that both found the namespace unused
only the first to mark it goes on, even when both write into the same ``--out`` (they would score
the same trajectories twice); the other is refused. Then it checks again that no live worker and
nothing of another pipeline appeared since the check, and if something did, it removes the mark it
set and refuses. A resume (the mark was already there at the check) finds the mark unchanged and
checks for live workers again. A worker started in the namespace after that refuses to start unless
it is the replay's own (:func:`rewardq.consumers.compose.refuse_replays_namespace`).

Each check reads single keys, so it runs on Redis Cluster as on one Redis.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rewardq.errors import ConfigError
from rewardq.ledger.replay import Trajectory
from rewardq.queue.connection import redact_url
from rewardq.queue.keys import Keyspace
from rewardq.queue.namespace import ReplayMark, read_replay_mark_sync

if TYPE_CHECKING:
    from rewardq.config import WorkerConfig
    from rewardq.queue.clients import SyncRedis


def replay_mark(out_id: str, scoring: str, out: str = "") -> ReplayMark:
    """The mark of a replay into the ``--out`` ``out`` of id ``out_id`` scoring with fingerprint
    ``scoring`` (``out`` is named in it absolute, password redacted)."""
    path = out if "://" in out or not out else os.path.abspath(out)
    return ReplayMark(out_id, scoring, redact_url(path))


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


def check_namespace(cfg: WorkerConfig, trajectories: Sequence[Trajectory], mark: ReplayMark) -> bool:
    """Refuse (ConfigError) ``cfg.namespace`` unless it is the replay's own (module doc): unused, or
    carrying ``mark``. Returns whether it carries ``mark`` (a resume), for :func:`mark_namespace`."""
    ns = cfg.namespace
    with _namespace(cfg) as (r, ks):
        _refuse_live(r, ks, ns)
        found = read_replay_mark_sync(r, ks)
        if found == mark:
            return True  # a replay into this --out, with this configuration: resume there
        if found is not None:
            raise ConfigError(
                f"--namespace {ns} holds a replay into another --out or with another scoring configuration "
                f"({ks.replay} = {found.encode()}): its keys would be refused as conflicting records; leave out "
                "--namespace, or name an unused one"
            )
        _refuse_used(r, ks, ns, trajectories)
        return False


def mark_namespace(cfg: WorkerConfig, mark: ReplayMark, *, resuming: bool) -> None:
    """Take ``cfg.namespace`` after :func:`check_namespace` allowed it (``resuming``: what it
    returned): set ``<ns>:replay`` to ``mark`` only if unset (``SET NX``), or, resuming, find it
    unchanged; then check again that no live worker (and, on a fresh mark, nothing of another
    pipeline) appeared since. Refuse (ConfigError) otherwise, removing a mark this call set."""
    ns = cfg.namespace
    with _namespace(cfg) as (r, ks):
        if resuming:
            found = read_replay_mark_sync(r, ks)
            if found != mark:
                raise ConfigError(
                    f"--namespace {ns} changed since it was checked: {ks.replay} is now "
                    f"{found.encode() if found else 'unset'}, not "
                    "this replay's mark; run again to check it anew, or leave out --namespace"
                )
        elif not r.set(ks.replay, mark.encode(), nx=True):
            same = read_replay_mark_sync(r, ks) == mark
            raise ConfigError(
                f"--namespace {ns} was marked by another replay ({ks.replay}) between this replay's check and "
                f"its mark{' (one into the same --out: both would score the same trajectories)' if same else ''}; "
                "leave out --namespace, or name an unused one"
            )
        try:
            _refuse_live(r, ks, ns)
            if not resuming:
                _refuse_used(r, ks, ns, (), appeared=True)
        except ConfigError:
            if not resuming:  # set NX by this call just now: no other replay can have set it since
                r.delete(ks.replay)
            raise


def _refuse_live(r: SyncRedis, ks: Keyspace, ns: str) -> None:
    """Refuse (ConfigError) a namespace live workers serve."""
    from rewardq.queue.reads import workers_status

    live = [w["name"] for w in workers_status(r, ks)]
    if live:
        raise ConfigError(
            f"--namespace {ns} is served by {len(live)} live worker(s) ({', '.join(live[:3])}"
            f"{', ...' if len(live) > 3 else ''}): they would score the replay's trajectories instead of the "
            "replay; leave out --namespace (a replay makes a namespace of its own), or name an unused one"
        )


def _refuse_used(
    r: SyncRedis, ks: Keyspace, ns: str, trajectories: Sequence[Trajectory], *, appeared: bool = False
) -> None:
    """Refuse (ConfigError) a namespace another producer or worker used (:func:`_uses`), or holding
    keys of ``trajectories``; ``appeared``: found after the replay's check passed."""
    used = _uses(r, ks)
    there = _keys_present(r, ks, trajectories)
    if there:
        used.append(f"results or trajectories of {there} of the trajectories to replay")
    if used:
        since = " (written since this replay checked it)" if appeared else ""
        raise ConfigError(
            f"--namespace {ns} already holds {', '.join(used)}{since}: it is another pipeline's (a fleet's, even "
            "with its workers down) or another ledger's replay, whose trajectories the replay's worker would "
            "score, and whose keys would be refused as conflicting records; leave out --namespace, or name "
            "an unused one"
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
