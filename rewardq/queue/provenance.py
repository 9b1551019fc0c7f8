"""The provenance blobs in Redis: ``<ns>:provenance``, digest -> JSON (see :mod:`rewardq.reward.provenance`).

A worker writes each blob once (``HSETNX``: the digest names its content, so a second writer has
nothing to add) before the first result that names it is committed; ``rewardq inspect`` reads
it. There are as many blobs as scorers times scoring configurations the namespace has seen: a
handful, so the hash has no expiry and goes with the namespace.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rewardq.queue.results import as_text

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis, SyncRedis
    from rewardq.queue.keys import Keyspace


async def publish(r: AsyncRedis, ks: Keyspace, digest: str, blob_json: str) -> None:
    """Write one blob (a no-op when it is there already)."""
    await r.hsetnx(ks.provenance, digest, blob_json)  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones


def lookup(r: SyncRedis, ks: Keyspace, digests: list[str]) -> dict[str, dict[str, Any]]:
    """The blobs of ``digests`` that exist, parsed (an unreadable one as ``{"raw": text}``)."""
    wanted = sorted({d for d in digests if d})
    if not wanted:
        return {}
    values = r.hmget(ks.provenance, wanted)
    out: dict[str, dict[str, Any]] = {}
    for digest, raw in zip(wanted, values):
        if raw is None:
            continue
        text = as_text(raw)
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = {"raw": text}
        out[digest] = parsed if isinstance(parsed, dict) else {"raw": text}
    return out
