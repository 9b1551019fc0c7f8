"""The scoring configuration a namespace records, and which live workers run which one.

``<ns>:meta`` field ``scoring`` holds ``{"digest": ..., "config": ..., "shown": {...}, "at": ...}`` (JSON): the
fingerprint of the scoring configuration (:mod:`rewardq.reward.scoring_fingerprint`) of the first
worker that served the namespace. Every worker's heartbeat (``<ns>:worker:<name>``) carries its own
digest in the field ``scoring``. The consumer side decides what to do with a difference
(:mod:`rewardq.consumers.scoring_gate`); this module only reads and writes:

* :func:`record_scoring`: write ours if none is recorded (``HSETNX``, atomic), return the recorded one;
* :func:`replace_scoring`: replace the recorded one, only if it is still the one seen (a Lua
  compare-and-set, ``lua/scoring.lua``);
* :func:`live_scorings`: the digest of every live worker (its heartbeat hash still exists);
* :func:`recorded_scoring` / :func:`recorded_scoring_sync`: what is recorded, or None.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rewardq.queue import scripts
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import as_text
from rewardq.queue.retry import script_call

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis, SyncRedis


#: The field of ``<ns>:meta`` and of a worker's heartbeat hash that holds a scoring fingerprint.
FIELD = "scoring"


@dataclass(frozen=True)
class RecordedScoring:
    """A scoring configuration as recorded: its ``digest``, readable ``config`` and, for a conflict
    message to name what differs, each of its values on its own (``shown``; empty in older records)."""

    digest: str
    config: str
    shown: dict[str, str] = field(default_factory=dict, compare=False)

    def encode(self) -> str:
        return json.dumps(
            {"digest": self.digest, "config": self.config, "shown": self.shown, "at": round(time.time(), 3)}
        )

    @classmethod
    def decode(cls, raw: object) -> RecordedScoring | None:
        """The recorded value, or None for none; a value that is not ours reads as an unknown configuration."""
        if raw is None:
            return None
        text = as_text(raw)
        try:
            d = json.loads(text)
            shown = d.get("shown")
            shown = {str(k): str(v) for k, v in shown.items()} if isinstance(shown, dict) else {}
            return cls(str(d["digest"]), str(d.get("config", "")), shown)
        except (ValueError, KeyError, TypeError):
            return cls(text[:64], f"(unreadable record {text[:64]!r})")


async def recorded_scoring(client: AsyncRedis, ks: Keyspace) -> RecordedScoring | None:
    """The scoring configuration ``<ns>:meta`` records, or None."""
    return RecordedScoring.decode(await client.hget(ks.meta, FIELD))  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones


def recorded_scoring_sync(client: SyncRedis, ks: Keyspace) -> RecordedScoring | None:
    """:func:`recorded_scoring` on a blocking client (``rewardq status``)."""
    return RecordedScoring.decode(client.hget(ks.meta, FIELD))


async def record_scoring(client: AsyncRedis, ks: Keyspace, mine: RecordedScoring) -> RecordedScoring:
    """Record ``mine`` unless a configuration is recorded already; returns the recorded one."""
    await client.hsetnx(ks.meta, FIELD, mine.encode())  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
    recorded = await recorded_scoring(client, ks)
    return recorded if recorded is not None else mine


async def replace_scoring(
    client: AsyncRedis, ks: Keyspace, seen: RecordedScoring | None, mine: RecordedScoring
) -> bool:
    """Replace the recorded configuration by ``mine`` if it is still ``seen`` (same digest); True
    when ``mine`` is recorded afterwards (replaced now, or already)."""
    raw = await client.hget(ks.meta, FIELD)  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
    now = RecordedScoring.decode(raw)
    if now is not None and now.digest == mine.digest:
        return True
    if now is None:  # nothing recorded (any more): record it as the first worker would
        return (await record_scoring(client, ks, mine)).digest == mine.digest
    if seen is None or now.digest != seen.digest:
        return False
    script = client.register_script(scripts.standalone("scoring"))  # type: ignore[misc]  # typed for Redis only; RedisCluster has one
    with script_call():
        after = await script(keys=[ks.meta], args=[FIELD, as_text(raw), mine.encode()])
    recorded = RecordedScoring.decode(after)
    return recorded is not None and recorded.digest == mine.digest


async def live_scorings(client: AsyncRedis, ks: Keyspace) -> dict[str, str]:
    """``{worker name: scoring digest}`` of every live worker (one whose heartbeat hash exists);
    a worker that publishes no digest maps to ``""``."""
    names = [as_text(raw) for raw in await client.zrange(ks.workers, 0, -1)]
    if not names:
        return {}
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hmget(ks.worker(name), [FIELD, "last_beat"])
    out: dict[str, str] = {}
    for name, (digest, beat) in zip(names, await pipe.execute()):
        if digest is not None or beat is not None:
            out[name] = as_text(digest) if digest is not None else ""
    return out
