"""A namespace's keys as a whole: which namespaces a server holds, how many keys one has, deleting them,
and the mark of the ``rewardq replay`` that holds it.

Used by the operator commands (a mistyped ``--namespace`` names the closest existing one) and by
``rewardq demo`` and the tests, which remove what they created. Never touches keys outside the
namespace it is given. The replay mark (``<ns>:replay``, :class:`ReplayMark`) is set and checked by
:mod:`rewardq.replay.namespace`; every worker reads it at start (:mod:`rewardq.consumers.compose`).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from rewardq.queue.connection import RedisError
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import as_text

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis, SyncRedis


#: The most namespaces the SCAN behind an unknown ``--namespace`` error collects to rank, and the
#: seconds that SCAN may take.
NAMESPACES_SCANNED = 5000
NAMESPACE_SCAN_BUDGET = 1.0


class ProducerClient(Protocol):
    """What :func:`delete_trajectory_keys` needs of a ``rewardq.producers.client.RewardClient``."""

    @property
    def keyspace(self) -> Keyspace: ...

    @property
    def r(self) -> SyncRedis: ...


def shard_count(client: SyncRedis, ks: Keyspace) -> int | None:
    """The shard count ``<ns>:meta`` records (None: no producer or worker has used the namespace)."""
    raw = client.hget(ks.meta, "shards")
    return None if raw is None else int(raw)


@dataclass(frozen=True)
class ReplayMark:
    """The value of ``<ns>:replay``: the ``rewardq replay`` a namespace belongs to, told by its
    ``--out``'s id (``out``) and its scoring fingerprint (``scoring``). ``path`` names that ``--out``
    for people (absolute, password redacted; empty in a mark that does not say it) and is not part
    of the identity: a resume that spells its ``--out`` another way is the same replay."""

    out: str
    scoring: str
    path: str = field(default="", compare=False)

    def encode(self) -> str:
        fields = {"out": self.out, "scoring": self.scoring} | ({"path": self.path} if self.path else {})
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def decode(cls, raw: object) -> ReplayMark | None:
        """The mark, or None for none; a value that is not a mark reads as one no replay has."""
        if raw is None:
            return None
        text = as_text(raw)
        try:
            d = json.loads(text)
            return cls(str(d["out"]), str(d["scoring"]), str(d.get("path") or ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(f"(unreadable mark {text[:64]!r})", "")


async def read_replay_mark(client: AsyncRedis, ks: Keyspace) -> ReplayMark | None:
    """The mark ``<ns>:replay`` holds, or None."""
    return ReplayMark.decode(await client.get(ks.replay))


def read_replay_mark_sync(client: SyncRedis, ks: Keyspace) -> ReplayMark | None:
    """:func:`read_replay_mark` on a blocking client (``rewardq replay``'s checks)."""
    return ReplayMark.decode(client.get(ks.replay))


def known_namespaces(
    client: SyncRedis, budget_s: float = NAMESPACE_SCAN_BUDGET, limit: int = NAMESPACES_SCANNED
) -> list[str]:
    """Namespaces that have a ``<ns>:meta`` hash, found by a SCAN bounded by ``budget_s`` seconds and
    ``limit`` names."""
    found: set[str] = set()
    deadline = time.monotonic() + budget_s
    try:
        for key in client.scan_iter(match="*:meta", count=1000, _type="HASH"):
            name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
            found.add(name[: -len(":meta")])
            if len(found) >= limit or time.monotonic() > deadline:
                break
    except (RedisError, OSError):  # a hint only (e.g. a user without SCAN): never fail the command over it
        pass
    return sorted(found)


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _scan(client: SyncRedis, pattern: str) -> list[bytes]:
    keys: list[bytes] = []
    for key in client.scan_iter(match=pattern, count=1000):
        keys.append(key)
    return keys


def delete_namespace(client: SyncRedis, namespace: str) -> int:
    """Delete every key under ``<namespace>:``; returns how many. Never touches other keys."""
    keys = _scan(client, _glob_escape(namespace) + ":*")
    deleted = 0
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        if getattr(client, "get_nodes", None) is not None:  # cluster: keys live in many slots
            for k in chunk:
                deleted += int(client.delete(k))
        else:
            deleted += int(client.delete(*chunk))
    return deleted


def delete_trajectory_keys(client: ProducerClient, keys: list[str]) -> int:
    """Delete the result hashes of ``keys`` and their trajectories' hashes, nothing else.

    ``client`` is a :class:`~rewardq.producers.client.RewardClient`; used when the namespace
    is shared with other work (``rewardq demo --workers 0``).
    """
    ks = client.keyspace
    targets = sorted({ks.reward_key(k) for k in keys} | {ks.traj_key(k.rpartition("_")[0]) for k in keys})
    deleted = 0
    for i in range(0, len(targets), 500):
        pipe = client.r.pipeline(transaction=False)
        for key in targets[i : i + 500]:
            pipe.delete(key)
        deleted += sum(int(n) for n in pipe.execute())
    return deleted
