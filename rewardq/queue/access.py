"""Checking, when a worker starts, that its Redis user may run every command the worker will send.

A Redis ACL that lacks one command the worker needs is otherwise found late or never: without
``EVALSHA`` the first store fails minutes in; without ``XCLAIM`` the reclaim of dead workers'
entries fails in a background loop and their trajectories never end. :func:`check_worker_access`
runs before anything else at start and raises the one-line
:class:`~rewardq.errors.RedisPermissionError` (exit code 2) naming every refused command and the
``ACL SETUSER`` grant (:func:`~rewardq.queue.connection.permission_error`).

The commands are :data:`DIRECT` (what the broker, the heartbeat and the metrics send) plus every
command inside the Lua scripts (found in their source: a script runs with the caller's ACL) but the
:data:`OPTIONAL` ones, which a script asks about itself before sending. Each
is checked one of two ways:

* ``ACL DRYRUN <user> <command> <args>`` (Redis 7.0+), when the user may run it (a restricted
  user usually may not); one pipeline, nothing runs;
* otherwise each command is tried harmlessly: on keys ``<ns>:{probe-<hex>}:*`` that do not exist
  (``EVALSHA`` of an unknown script answers NOSCRIPT, ``XCLAIM`` on a missing stream NOGROUP: any
  answer but NOPERM means permitted), the writes on one such hash and sorted set that are deleted
  at the end (they also expire in 60 s). On Redis Cluster every probe key shares one hash tag, so
  the tries run on that slot's node (plus ``SCRIPT LOAD``, which goes to every primary).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoPermissionError, ResponseError

from rewardq.errors import RedisPermissionError
from rewardq.queue import scripts
from rewardq.queue.connection import client_user, is_cluster_client, permission_error
from rewardq.queue.keys import Keyspace

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis


#: Commands the worker sends itself, outside its Lua scripts.
DIRECT = (
    "XGROUP CREATE",
    "XGROUP DELCONSUMER",
    "XREADGROUP",
    "XPENDING",
    "XCLAIM",
    "XINFO CONSUMERS",
    "XINFO GROUPS",
    "XLEN",
    "XADD",
    "XACK",
    "XDEL",
    "EVALSHA",
    "SCRIPT LOAD",
    "GET",
    "HGET",
    "HMGET",
    "HSET",
    "HSETNX",
    "HINCRBY",
    "EXPIRE",
    "DEL",
    "ZADD",
    "ZREM",
    "ZRANGE",
)
#: A command's name and the harmless call that tries it.
Probe = tuple[str, tuple[Any, ...]]
_CALL = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]")


#: Commands a script sends only when ``redis.acl_check_cmd`` says the user may, asked before its
#: first write; without them it does the same with the others (``commit`` writes each key's result
#: with ``HSET`` instead of copying key 0's with ``COPY`` after reading its ``OBJECT ENCODING``).
#: A user is not required to have them: granting them makes ``commit`` cheaper.
OPTIONAL = frozenset({"COPY", "OBJECT"})


def script_commands() -> set[str]:
    """Every command the worker's Lua scripts call (from the source of every script rewardq ships),
    upper case, but the :data:`OPTIONAL` ones."""
    return {m.upper() for src in scripts.shipped_sources() for m in _CALL.findall(src)} - OPTIONAL


def worker_commands() -> list[str]:
    """Every command a worker sends, directly or from a script, sorted."""
    return sorted(set(DIRECT) | script_commands())


def probe(command: str, key: str, key2: str, hkey: str, zkey: str, group: str) -> tuple[object, ...]:
    """The harmless call that tries ``command``: ``key``/``key2`` do not exist, ``hkey``/``zkey`` are the
    probe's own hash and sorted set. KeyError for a command without a probe (a test keeps the table whole)."""
    return {
        "DEL": ("DEL", key),
        "EXISTS": ("EXISTS", key),
        "EXPIRE": ("EXPIRE", hkey, 60),
        "PEXPIRE": ("PEXPIRE", key, 60000),
        "PERSIST": ("PERSIST", key),
        "PTTL": ("PTTL", key),
        "RENAME": ("RENAME", key, key2),
        "TIME": ("TIME",),
        "HDEL": ("HDEL", hkey, "absent"),
        "HEXISTS": ("HEXISTS", key, "f"),
        "HGET": ("HGET", key, "f"),
        "HGETALL": ("HGETALL", key),
        "HINCRBY": ("HINCRBY", hkey, "n", 1),
        "HKEYS": ("HKEYS", key),
        "HLEN": ("HLEN", key),
        "HMGET": ("HMGET", key, "f"),
        "HSET": ("HSET", hkey, "f", "1"),
        "HSETNX": ("HSETNX", hkey, "g", "1"),
        "ZADD": ("ZADD", zkey, 0, "m"),
        "ZREM": ("ZREM", zkey, "m"),
        "ZRANGE": ("ZRANGE", key, 0, 0),
        "ZCARD": ("ZCARD", key),
        "ZPOPMIN": ("ZPOPMIN", key, 1),
        "ZREMRANGEBYSCORE": ("ZREMRANGEBYSCORE", zkey, "-inf", "(-1"),
        "GET": ("GET", key),
        "ZRANGEBYSCORE": ("ZRANGEBYSCORE", key, "-inf", "+inf", "LIMIT", 0, 1),
        "XACK": ("XACK", key, group, "0-1"),
        "XADD": ("XADD", key, "NOMKSTREAM", "MAXLEN", 1, "*", "f", "v"),
        "XCLAIM": ("XCLAIM", key, group, "probe", 0, "0-1"),
        "XDEL": ("XDEL", key, "0-1"),
        "XLEN": ("XLEN", key),
        "XRANGE": ("XRANGE", key, "-", "+", "COUNT", 1),
        "XREADGROUP": ("XREADGROUP", "GROUP", group, "probe", "COUNT", 1, "STREAMS", key, ">"),
        "XPENDING": ("XPENDING", key, group, "-", "+", 1),
        "XGROUP CREATE": ("XGROUP", "CREATE", key, group, "0"),
        "XGROUP DELCONSUMER": ("XGROUP", "DELCONSUMER", key, group, "probe"),
        "XINFO CONSUMERS": ("XINFO", "CONSUMERS", key, group),
        "XINFO GROUPS": ("XINFO", "GROUPS", key),
        "EVALSHA": ("EVALSHA", "0" * 40, 1, key),
        "SCRIPT LOAD": ("SCRIPT", "LOAD", "return 1"),
    }[command]


async def check_worker_access(client: AsyncRedis, ks: Keyspace, url: str) -> None:
    """Raise :class:`~rewardq.errors.RedisPermissionError` naming every command of
    :func:`worker_commands` the client's Redis user may not run (see the module doc)."""
    tag = f"{ks.namespace}:{{probe-{secrets.token_hex(4)}}}"
    keys = (f"{tag}:a", f"{tag}:b", f"{tag}:h", f"{tag}:z")
    last = ("EXPIRE", "DEL")  # the probe hash gets its TTL after it is written
    ordered = sorted(worker_commands(), key=lambda c: (c in last, last.index(c) if c in last else 0, c))
    calls = [(c, probe(c, *keys, group=ks.group)) for c in ordered]
    user = client_user(client)
    refused = None if is_cluster_client(client) else await _dry_run(client, user, calls)
    if refused is None:
        refused = await _try_all(client, calls, keys)
    if refused:
        raise refusal(refused, ks.namespace, url, user)


def refusal(commands: Sequence[str], namespace: str, url: str, user: str) -> RedisPermissionError:
    """The one-line error for ``commands`` the user may not run."""
    what = ", ".join(commands)
    return permission_error(
        RuntimeError(f"NOPERM it may not run {what} (checked when the worker started; it needs every one)"),
        namespace,
        url,
        user=user,
    )


async def _dry_run(client: AsyncRedis, user: str, calls: list[Probe]) -> list[str] | None:
    """The refused commands by ``ACL DRYRUN`` (MULTI and EXEC included), or None when it is not available."""
    try:
        if _text(await client.execute_command("ACL", "DRYRUN", user, "TIME")) != "OK":
            return None
    except ResponseError:  # NOPERM (the usual restricted user), or a Redis before 7.0
        return None
    calls = [*calls, ("MULTI", ("MULTI",)), ("EXEC", ("EXEC",))]
    pipe = client.pipeline(transaction=False)
    for _, args in calls:
        pipe.execute_command("ACL", "DRYRUN", user, *args)
    replies = await pipe.execute(raise_on_error=False)
    if any(isinstance(r, Exception) and not isinstance(r, NoPermissionError) for r in replies):
        return None  # a reply DRYRUN should not give: try the commands instead
    return [name for (name, _), r in zip(calls, replies) if isinstance(r, Exception) or _text(r) != "OK"]


async def _try_all(client: AsyncRedis, calls: list[Probe], keys: Sequence[str]) -> list[str]:
    """The refused commands, by trying each (in order, the writes last undone), then the probe keys deleted."""
    refused: list[str] = []
    if isinstance(client, RedisCluster):  # to the probe slot's node (SCRIPT LOAD: every primary), not by key parsing
        await client.initialize()  # the slot map (a no-op once the client has it)
        node = client.get_node_from_key(keys[0])
        for name, args in calls:
            target = client.get_primaries() if name == "SCRIPT LOAD" else node
            try:
                await client.execute_command(*args, target_nodes=target)
            except NoPermissionError:
                refused.append(name)
            except ResponseError:
                pass
    else:
        pipe = client.pipeline(transaction=False)
        for _, args in calls:
            pipe.execute_command(*args)
        replies = await pipe.execute(raise_on_error=False)
        refused = [name for (name, _), r in zip(calls, replies) if isinstance(r, NoPermissionError)]
        try:  # MULTI and EXEC: a dead letter for an entry without a trajectory is one transaction
            txn = client.pipeline(transaction=True)
            txn.execute_command("XLEN", keys[0])
            await txn.execute()
        except NoPermissionError:
            refused.append("MULTI")
        except ResponseError:
            pass
    for key in keys:
        try:
            await client.execute_command("DEL", key)
        except ResponseError:
            pass  # no DEL: refused above; the probe keys expire in 60 s
    return refused


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
