"""The Lua scripts, loaded once from ``rewardq/queue/lua/``.

Each script is ``common.lua`` (shared helpers) followed by its own file. Every key a
script touches carries one shard's hash tag, so each runs in one slot on Redis Cluster.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

NAMES = ("store", "commit", "fail", "expire", "renew", "release", "claimable", "claim")


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """Full Lua source of script ``name`` (common helpers included)."""
    if name not in NAMES:
        raise KeyError(f"no Lua script {name!r}; known: {NAMES}")
    lua = resources.files("rewardq.queue") / "lua"
    return (lua / "common.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()
