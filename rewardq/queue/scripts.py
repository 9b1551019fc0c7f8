"""The Lua scripts, loaded once from ``rewardq/queue/lua/``.

Each script is ``common.lua`` (shared helpers) followed by its own file. Every key a
script touches carries one shard's hash tag, so each runs in one slot on Redis Cluster.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

NAMES = ("store", "commit", "fail", "expire", "renew", "release", "claimable", "claim", "unfinished")
#: Scripts that run on their own, without ``common.lua``.
STANDALONE = ("ratelimit", "judge", "scoring", "budget")


@cache
def source(name: str) -> str:
    """Full Lua source of script ``name`` (common helpers included)."""
    if name not in NAMES:
        raise KeyError(f"no Lua script {name!r}; known: {NAMES}")
    lua = resources.files("rewardq.queue") / "lua"
    return (lua / "common.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


@cache
def standalone(name: str) -> str:
    """Lua source of a script that does not use the shared helpers (``ratelimit``)."""
    if name not in STANDALONE:
        raise KeyError(f"no standalone Lua script {name!r}; known: {STANDALONE}")
    return (resources.files("rewardq.queue") / "lua" / f"{name}.lua").read_text()
