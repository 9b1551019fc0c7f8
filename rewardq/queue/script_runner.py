"""Running rewardq's Lua scripts: one call, or many in one round trip, on one Redis or a cluster.

:class:`ScriptRunner` registers every script of :mod:`rewardq.queue.scripts` on a client and
runs them for the broker. Every call is marked as a script call for the retry policy
(:func:`~rewardq.queue.retry.script_call`: a script is re-sent only when it cannot have run).

``NOSCRIPT`` (the script is not loaded: a fresh or restarted Redis, a fresh or failed-over
cluster node) means the call did not run; the runner loads the script and sends those calls
again. On one Redis a batch is an ordinary pipeline of ``EVALSHA`` (redis-py's own pipelined
scripts would send ``SCRIPT EXISTS`` first: one more round trip on every call). On Redis
Cluster, redis-py's ClusterPipeline refuses ``evalsha()`` because it cannot reload a script,
so the calls go as raw ``EVALSHA`` commands, which the pipeline routes by the keys' slot and
sends as one batch per node.

Before its first call the runner asks the server once whether it reads a script's ``#!lua``
shebang (:mod:`rewardq.queue.scripts`, "Flags"): Redis 7 does, and then the scripts that write
results are refused whole when Redis is past ``maxmemory`` (an ``OOM`` error reply, which
:func:`~rewardq.queue.connection.is_out_of_memory` recognises). Redis before 7.0 and fakeredis do not: there the same
scripts run without their shebang, and the log says once that ``maxmemory`` is not checked for them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from rewardq.queue import scripts
from rewardq.queue.connection import is_cluster_client
from rewardq.queue.retry import script_call

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis

logger = logging.getLogger("rewardq.queue")

#: One script call: its ``(keys, args)``.
Call = tuple[list[Any], list[Any]]
#: The script that tells whether a server reads shebang flags (it writes nothing).
_FLAGS_PROBE = "#!lua flags=no-writes,allow-oom\nreturn 1"


class ScriptRunner:
    """The Lua scripts of :mod:`rewardq.queue.scripts`, registered on ``client`` and run on demand.

    Args:
        client: a ``redis.asyncio`` client (or cluster client) with ``decode_responses=False``.
    """

    def __init__(self, client: AsyncRedis) -> None:
        self.r = client
        self.cluster = is_cluster_client(client)
        self._scripts = self._register(flagged=True)
        self.flagged: bool | None = None  # whether the server reads shebang flags (None: not asked yet)

    def _register(self, *, flagged: bool) -> dict[str, AsyncScript]:
        return {name: self.r.register_script(scripts.source(name, flagged)) for name in scripts.NAMES}  # type: ignore[misc]  # redis-py's asyncio RedisCluster.register_script is typed for Redis only; it has one

    async def _ask_flags(self) -> None:
        """Find out once whether the server reads ``#!lua`` flags; use the plain scripts if not."""
        try:
            sha = await self.r.script_load(_FLAGS_PROBE)
            await self.r.evalsha(sha, 0)  # type: ignore[misc]  # redis-py types evalsha as sync-or-async
            self.flagged = True
        except NoScriptError:
            raise
        except ResponseError as exc:
            if "#" not in str(exc) and "shebang" not in str(exc).lower():
                raise
            self.flagged = False
            self._scripts = self._register(flagged=False)
            stand_in = "<python>" in str(exc)  # fakeredis (the embedded demo's Redis) compiles scripts so
            logger.log(
                logging.INFO if stand_in else logging.WARNING,
                "this Redis does not read Lua script flags (%s; Redis 7.0+ does): result commits are not "
                "refused when it is past maxmemory",
                "the embedded stand-in" if stand_in else str(exc)[:200],
            )

    async def run(self, name: str, keys: list[Any], args: list[Any]) -> Any:
        """Run script ``name`` once and return its reply (raise its error).

        On Redis Cluster it goes as a one-call pipeline, which the worker's client sends once
        (see :func:`~rewardq.queue.connection.connect_async`, ``scripts_once``).
        """
        if self.flagged is None:
            await self._ask_flags()
        if self.cluster:
            (reply,) = await self.run_many(name, [(keys, args)])
            if isinstance(reply, Exception):
                raise reply
            return reply
        with script_call():
            return await self._scripts[name](keys=keys, args=args)

    async def run_many(self, name: str, calls: Sequence[Call]) -> list[Any]:
        """Run script ``name`` once per ``(keys, args)`` in one round trip; replies (or errors) in order."""
        if self.flagged is None:
            await self._ask_flags()
        with script_call():
            if self.cluster:
                return await self._run_on_cluster(name, calls)
            return await self._run_on_one(name, calls)

    async def _run_on_one(self, name: str, calls: Sequence[Call]) -> list[object]:
        script = self._scripts[name]
        replies = await self._pipeline(script, calls)
        for _ in range(2):  # a fresh or restarted Redis; twice if it restarts again in between
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if not missing:
                break
            logger.info("script %s is not loaded in Redis (fresh or restarted); loading it", name)
            for i, reply in zip(missing, await self._pipeline(script, [calls[i] for i in missing], load=True)):
                replies[i] = reply
        return replies

    async def _run_on_cluster(self, name: str, calls: Sequence[Call]) -> list[object]:
        """The calls a node answered with NOSCRIPT are retried after ``SCRIPT LOAD`` on every primary."""
        script = self._scripts[name]
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(3):
            if attempt:
                logger.info("script %s missing on a cluster node; loading it on every primary", name)
                await self.r.script_load(script.script)
            pipe = self.r.pipeline()
            for i in todo:
                keys, args = calls[i]
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            got = await pipe.execute(raise_on_error=False)
            for i, reply in zip(todo, got):
                replies[i] = reply
            todo = [i for i, reply in zip(todo, got) if isinstance(reply, NoScriptError)]
            if not todo:
                break
        return replies

    async def _pipeline(self, script: AsyncScript, calls: Sequence[Call], *, load: bool = False) -> list[object]:
        """One pipeline of ``EVALSHA`` calls (``SCRIPT LOAD`` first when ``load``); replies in order."""
        pipe = self.r.pipeline(transaction=False)
        if load:
            pipe.script_load(script.script)
        for keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies = await pipe.execute(raise_on_error=False)
        return replies[1:] if load else replies
