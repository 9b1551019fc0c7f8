"""The Lua scripts, loaded once: the pipeline's own from ``rewardq/queue/lua/``, a feature's from its folder.

Each pipeline script is the part of ``common.lua`` (shared helpers) it uses followed by its own
file (:func:`source`). A feature that
keeps state in Redis (rate limits, the judge's answer cache) keeps its one standalone script in
its own folder, beside the code that calls it, and loads it with :func:`feature_source`. Every key a
script touches carries one shard's hash tag, so each runs in one slot on Redis Cluster.

**Flags.** Redis checks ``maxmemory`` for a script once, before it starts, and only when the
script declares flags in a ``#!lua`` shebang (Redis 7.0+): a script without a shebang runs in
compatibility mode, where a write that follows an earlier write of the same script goes past
``maxmemory``. So the scripts that write results or dead letters (:data:`FLAGS`: ``commit``,
``fail``, ``expire``, ``deadletter``) carry a shebang without ``allow-oom``: on a Redis past
``maxmemory`` they are refused whole (``OOM ...``), before they write anything, and the worker
waits for room
(:mod:`rewardq.consumers.retries`). Each writes a bounded number of bytes once it starts (its
budget comment), so Redis ends at most one script's writes past its cap. ``renew`` and
``release`` write a few small fields per trajectory and must work when Redis is full (a lease
that cannot be renewed is taken over): they declare ``allow-oom``. So does ``store``, which files a
record the producer's ``XADD`` already brought into Redis (a plain command, refused past
``maxmemory``, so producers are the ones held back): it copies at most one small record
(``STORE_INLINE_BYTES``) into its trajectory hash, deleting its entry, or writes a reference to a
larger one, and it is what lets a trajectory be scored and its records freed; refusing it would
leave a full Redis with no way to drain. So does ``commit_last``, the
last call of a trajectory committed in chunks (``commit.lua`` again): its earlier chunks were each
admitted under ``maxmemory`` and hold their memory until it renames them into place, so it must
not wait for room they take; it writes at most one chunk (``commit_bytes``) itself. A trajectory
therefore takes Redis at most one chunk past ``maxmemory``. The bookkeeping that lets a full
Redis drain, or keeps a live worker from looking dead, is small and declares ``allow-oom`` too:
``claim`` (one hash of a trajectory's digests: the fast path of ``store``), ``unfinished`` (a
counter and a reason of at most 500 bytes), ``count`` (a trajectory's starts in a scorer),
``stage`` (the lease of the one chunked commit that
may stage at a time, whose taker deletes a dead holder's staged chunks) and ``beat`` (a worker's
heartbeat: a few KB). No script declares
``no-cluster``; on Redis Cluster a script with flags may touch only keys of its declared keys'
slot, which every rewardq script does.

A server that cannot read a shebang (Redis before 7.0; fakeredis, behind the embedded demo) runs
the same scripts without it (:func:`source` with ``flagged=False``; the
:class:`~rewardq.queue.script_runner.ScriptRunner` finds out once per client).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

NAMES = (
    "store",
    "commit",
    "commit_last",
    "fail",
    "expire",
    "deadletter",
    "renew",
    "release",
    "claimable",
    "claim",
    "unfinished",
    "cancel",
    "stage",
    "beat",
    "count",
)
#: Scripts that are another script's file under other flags.
FILES = {"commit_last": "commit"}
#: Scripts of this package that run on their own, without ``common.lua``.
STANDALONE = ("scoring", "budget")
#: The shebang flags of the scripts that declare them (see the module doc); the others run in
#: Redis's compatibility mode.
FLAGS = {
    "store": "allow-oom",
    "commit": "",
    "commit_last": "allow-oom",
    "fail": "",
    "expire": "",
    "deadletter": "",
    "renew": "allow-oom",
    "release": "allow-oom",
    "claim": "allow-oom",
    "unfinished": "allow-oom",
    "stage": "allow-oom",
    "beat": "allow-oom",
    "count": "allow-oom",
}


@cache
def source(name: str, flagged: bool = True) -> str:
    """Full Lua source of script ``name`` (the common helpers it uses included); ``flagged``: with its
    ``#!lua`` shebang line when it has one in :data:`FLAGS`."""
    if name not in NAMES:
        raise KeyError(f"no Lua script {name!r}; known: {NAMES}")
    own = (resources.files("rewardq.queue") / "lua" / f"{FILES.get(name, name)}.lua").read_text()
    body = used_common(own) + "\n" + own
    return f"{shebang(name)}\n{body}" if flagged and name in FLAGS else body


#: A top-level definition of ``common.lua``: ``local NAME = ...`` or ``local function NAME(...)``.
_DEFINITION = re.compile(r"local (?:function )?([A-Za-z_]\w*)")
_WORD = re.compile(r"[A-Za-z_]\w*")


@cache
def common_definitions() -> tuple[str, tuple[tuple[str, str], ...]]:
    """``common.lua`` cut into its header and its top-level definitions, in order: ``(name, text)``,
    each text with the comment lines just above it."""
    lines = (resources.files("rewardq.queue") / "lua" / "common.lua").read_text().split("\n")
    starts: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        m = _DEFINITION.match(line)
        if m:
            first = i
            while first > 0 and lines[first - 1].startswith("--"):
                first -= 1
            starts.append((first, m.group(1)))
    ends = [first for first, _ in starts[1:]] + [len(lines)]
    header = "\n".join(lines[: starts[0][0]])
    return header, tuple((name, "\n".join(lines[a:b])) for (a, name), b in zip(starts, ends))


def _words(lua: str) -> set[str]:
    """Identifiers of ``lua`` outside its whole-line comments (a word in a trailing comment or a
    string counts too: at worst a definition is kept that the script does not need)."""
    code = "\n".join(line for line in lua.split("\n") if not line.lstrip().startswith("--"))
    return set(_WORD.findall(code))


def used_common(own: str) -> str:
    """The definitions of ``common.lua`` that the script ``own`` uses, directly or through another
    definition, in their order there (after its header). Redis runs a script's whole body on every
    ``EVALSHA``, so each definition it carries is built again on every call; a script carries only
    what it may call."""
    header, defs = common_definitions()
    words = {name: _words(text) for name, text in defs}
    needed = _words(own) & set(words)
    todo = list(needed)
    while todo:
        for name in words[todo.pop()] & set(words):
            if name not in needed:
                needed.add(name)
                todo.append(name)
    return "\n".join([header, *(text for name, text in defs if name in needed)])


def shebang(name: str) -> str:
    """The ``#!lua`` line of a script in :data:`FLAGS`."""
    return f"#!lua flags={FLAGS[name]}"


@cache
def standalone(name: str) -> str:
    """Lua source of a script of this package that does not use the shared helpers (``budget``)."""
    if name not in STANDALONE:
        raise KeyError(f"no standalone Lua script {name!r}; known: {STANDALONE}")
    return (resources.files("rewardq.queue") / "lua" / f"{name}.lua").read_text()


@cache
def feature_source(package: str, name: str) -> str:
    """Lua source of ``<name>.lua`` in the folder of the feature package ``package``: a standalone
    script, kept beside the code that sends it."""
    return (resources.files(package) / f"{name}.lua").read_text()


def shipped_sources() -> list[str]:
    """The source of every Lua file rewardq ships, wherever it is kept (``queue/lua/`` and the
    features' folders): what :mod:`rewardq.queue.access` reads a worker's script commands from."""
    out: list[str] = []
    todo = [resources.files("rewardq")]
    while todo:
        for item in sorted(todo.pop().iterdir(), key=lambda t: t.name):
            if item.is_dir() and item.name != "__pycache__":
                todo.append(item)
            elif item.name.endswith(".lua"):
                out.append(item.read_text())
    return out
