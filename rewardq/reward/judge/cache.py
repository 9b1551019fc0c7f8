"""LLM-judge requests billed once across the fleet: an answer cache with a claim to send each request.

Why: a judge request costs money and minutes. A trajectory is scored again after a worker
crash, a reclaim or a redelivery (delivery is at-least-once), and two workers can hold the
same request at once (two trajectories with identical prompts, or a redelivery racing the
original). Each request is therefore keyed by a digest of its full body and sent by one caller
only; its answer is kept for ``ttl`` seconds (the worker's ``result_ttl``) and every later
caller reuses it.

What one request holds (one HASH, ``<ns>:judge:<digest>``, see :mod:`rewardq.queue.keys` and
``judge.lua`` beside this module)::

    a     the answer (JSON text), once some caller got it; the hash then lives for ``ttl``
    c     the caller holding the claim to send the request
    cu    the server time its claim's lease ends

Semantics of :meth:`JudgeCache.claim`:

* **Hit.** The answer is there: the caller gets it and sends nothing.
* **Claimed.** Nobody holds a live claim: the caller takes it and must send the request, then
  :meth:`Claim.put` the answer. While it works (waiting for the rate limiter, retrying a 429)
  the claim's lease is renewed every ``lease_seconds / 3``.
* **Wait.** Another caller holds a live claim: this one polls (20 ms doubling up to
  ``max_poll``) until the answer appears or the claim is given up.
* **The holder dies** (SIGKILL mid-request): nobody renews its lease, so it ends at most
  ``lease_seconds`` later and the next caller to ask takes the claim and sends the request. The
  answer the dead caller paid for never arrived anywhere, so that request is paid twice: this is
  the only case in which it is. A holder that fails (the judge stays down) releases the claim at
  once, so a waiter tries the request itself instead of waiting out the lease.

Every decision is one Lua script on one key (one slot: it works on Redis Cluster) using the
server's clock. Fleet-wide counters per judge model live in ``<ns>:judge-stats`` (HINCRBY;
``rewardq status`` reads them with :func:`judge_totals`).

With ``shared`` (genrm ``judge_cache=shared``) the hash lives outside the namespace, content-addressed
across runs, with its own TTL and a per-model size bound (:mod:`rewardq.reward.judge.shared`); the
claim works the same.

A caller cancelled while it holds the claim (its trajectory was cancelled) releases it on the way
out, so a waiter sends the request at once instead of waiting out the lease.

:class:`LocalJudgeCache` has the same interface inside one process (no Redis configured).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewardq.queue import scripts
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import as_text
from rewardq.queue.retry import script_call
from rewardq.reward.judge.shared import SharedSpace, models_key

if TYPE_CHECKING:
    from rewardq.queue.clients import AsyncRedis, SyncRedis


#: Seconds a dead worker's claim on a judge request (and its concurrency slot) holds others back.
JUDGE_LEASE_SECONDS = 30.0
#: Longest pause, in seconds, between two looks at a judge request another worker is sending.
JUDGE_MAX_POLL = 0.5

logger = logging.getLogger("rewardq.reward.judge.cache")

#: The counters kept per judge model (``<ns>:judge-stats`` fields ``<counter>:<model>``).
COUNTERS = (
    "requests",
    "errors",
    "failed",
    "answers",
    "cache_hits",
    "prompt_tokens",
    "completion_tokens",
    "aborted",
    "shared_hits",
    "saved_tokens",
)


@dataclass
class Claim:
    """What :meth:`JudgeCache.claim` hands its caller.

    Attributes:
        answer: the cached answer (a hit), or None: the caller sends the request and calls :meth:`put`.
        waited: seconds spent waiting for another caller's claim.
    """

    answer: str | None
    waited: float = 0.0
    _put: Any = field(default=None, repr=False)
    stored: bool = False

    @property
    def hit(self) -> bool:
        return self.answer is not None

    async def put(self, answer: str) -> None:
        """Store the answer this caller got (for every later caller) and give up the claim."""
        if self._put is None:
            raise RuntimeError("put() on a cache hit: nothing was claimed")
        await self._put(answer)
        self.stored = True


class _CacheBase:
    """The waiting loop, the claim context manager and the lease renewal; subclasses hold the state."""

    def __init__(
        self,
        *,
        ttl: float,
        lease_seconds: float = JUDGE_LEASE_SECONDS,
        max_poll: float = JUDGE_MAX_POLL,
        holder_prefix: str | None = None,
        reuse: bool = True,
    ) -> None:
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        self.reuse = reuse
        self.ttl = float(ttl)
        self.lease_seconds = float(lease_seconds)
        self.max_poll = max_poll
        self.holder_prefix = holder_prefix or f"{socket.gethostname()}:{os.getpid()}"

    # -- what subclasses provide -------------------------------------------------------
    async def _op(self, digest: str, op: str, holder: str, answer: str = "") -> tuple[str, Any]:
        """``get`` -> ``("hit", answer) | ("claimed", None) | ("wait", seconds)``; ``renew`` /
        ``release`` -> ``("ok", bool)``; ``put`` -> ``("ok", True)``."""
        raise NotImplementedError

    async def count(self, model: str, **increments: int) -> None:
        """Add to the fleet's counters of judge ``model`` (see :data:`COUNTERS`)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Nothing to release by default (the Redis client belongs to the caller)."""

    # -- the claim ---------------------------------------------------------------------
    @asynccontextmanager
    async def claim(self, digest: str) -> AsyncIterator[Claim]:
        """The cached answer of request ``digest``, or the claim to send it (see the module doc).

        On exit an unfilled claim is released, also on error or cancellation. With ``reuse=False``
        every caller sends its request and nothing is kept (the counters still are).
        """
        if not self.reuse:

            async def discard(answer: str) -> None:
                return None

            yield Claim(answer=None, _put=discard)
            return
        holder = f"{self.holder_prefix}:{uuid.uuid4().hex[:12]}"
        poll, waited = 0.02, 0.0
        while True:
            kind, value = await self._op(digest, "get", holder)
            if kind == "hit":
                yield Claim(answer=value, waited=waited)
                return
            if kind == "claimed":
                break
            pause = min(float(value), poll) * (1.0 + random.uniform(0.0, 0.1)) + 0.001
            poll = min(poll * 2, self.max_poll)
            waited += pause
            await asyncio.sleep(pause)

        async def put(answer: str) -> None:
            await self._op(digest, "put", holder, answer)

        claim = Claim(answer=None, waited=waited, _put=put)
        renewer = asyncio.create_task(self._renew_loop(digest, holder))
        try:
            yield claim
        finally:
            renewer.cancel()
            with suppress(asyncio.CancelledError):
                await renewer
            if not claim.stored:
                try:
                    await asyncio.shield(self._op(digest, "release", holder))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a failed release must not fail the judged call; the lease frees it
                    logger.warning(
                        "could not release judge claim %s (%s); it frees itself in %.0fs",
                        digest[:16],
                        exc,
                        self.lease_seconds,
                    )

    async def _renew_loop(self, digest: str, holder: str) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                _, renewed = await self._op(digest, "renew", holder)
            except Exception as exc:  # noqa: BLE001 - the renew loop outlives a failed renew; the lease is the fallback
                logger.warning("could not renew judge claim %s: %s", digest[:16], exc)
                continue
            if not renewed:
                logger.warning(
                    "judge claim %s expired before it was renewed (event loop blocked for more than %.0fs?); "
                    "another worker may send the same request",
                    digest[:16],
                    self.lease_seconds,
                )
                return


class JudgeCache(_CacheBase):
    """The fleet-wide cache on the pipeline's Redis.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` client.
        keyspace: the pipeline's keyspace (``judge(digest)`` and ``judge_stats`` keys).
        ttl: seconds an answer is kept (the worker's ``result_ttl``; 0 keeps it for ever).
        lease_seconds: how long a claim outlives a holder that stopped renewing it.
        owns_redis: close the client in :meth:`close` (see :func:`open_judge_cache`).
    """

    def __init__(
        self,
        redis: AsyncRedis,
        keyspace: Keyspace,
        *,
        owns_redis: bool = False,
        shared: SharedSpace | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(**settings)
        self.redis = redis
        self.ks = keyspace
        self.owns_redis = owns_redis
        self.shared = shared
        self._registered = False
        self._script = redis.register_script(scripts.feature_source("rewardq.reward.judge", "judge"))  # type: ignore[misc]  # redis-py's asyncio RedisCluster.register_script is typed for Redis only; it has one

    async def close(self) -> None:
        if self.owns_redis:
            await self.redis.aclose()
            self.owns_redis = False

    async def _op(self, digest: str, op: str, holder: str, answer: str = "") -> tuple[str, Any]:
        args = [op, holder]
        if op in ("get", "renew"):
            args.append(repr(self.lease_seconds))
        elif op == "put":
            ttl = self.shared.ttl if self.shared is not None else self.ttl
            args += [answer, str(int(ttl * 1000))]
            if self.shared is not None:
                args.append(str(self.shared.max_entries))
                await self._register()
        keys = [self.ks.judge(digest)] if self.shared is None else [self.shared.key(digest), self.shared.index]
        with script_call():  # never re-sent blindly by the retry policy (see rewardq.queue.retry)
            reply = await self._script(keys=keys, args=args)
        if op != "get":
            return "ok", bool(int(reply[0]))
        kind = as_text(reply[0])
        if kind == "hit":
            return kind, as_text(reply[1])
        return kind, float(as_text(reply[1])) if kind == "wait" else None

    async def _register(self) -> None:
        """Name the model of the shared answers once (``rewardq judge-cache list`` shows it)."""
        if self.shared is not None and not self._registered:
            await self.redis.hset(models_key(), self.shared.tag, self.shared.model)  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
            self._registered = True

    async def count(self, model: str, **increments: int) -> None:
        """HINCRBY the fleet's counters of ``model``; the hash lives ``ttl`` after its last change."""
        fields = {f"{name}:{model}": int(n) for name, n in increments.items() if n}
        if not fields:
            return
        unknown = {name for name in increments} - set(COUNTERS)
        if unknown:
            raise ValueError(f"unknown judge counters {sorted(unknown)}; known: {COUNTERS}")
        key = self.ks.judge_stats
        pipe = self.redis.pipeline(transaction=False)
        for name, n in fields.items():
            pipe.hincrby(key, name, n)
        if self.ttl > 0:
            pipe.pexpire(key, int(self.ttl * 1000))
        await pipe.execute()


class LocalJudgeCache(_CacheBase):
    """The same cache for one process: answers in memory, ``time.monotonic`` as the clock."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.answers: dict[str, tuple[str, float]] = {}
        self.claims: dict[str, tuple[str, float]] = {}
        self.counters: dict[str, dict[str, int]] = {}

    async def _op(self, digest: str, op: str, holder: str, answer: str = "") -> tuple[str, Any]:
        now = time.monotonic()
        kept = self.answers.get(digest)
        if kept is not None and self.ttl > 0 and kept[1] <= now:
            del self.answers[digest]
            kept = None
        held = self.claims.get(digest)
        if op == "get":
            if kept is not None:
                return "hit", kept[0]
            if held is not None and held[0] != holder and held[1] > now:
                return "wait", held[1] - now
            self.claims[digest] = (holder, now + self.lease_seconds)
            return "claimed", None
        if op == "put":
            self.answers[digest] = (answer, now + self.ttl if self.ttl > 0 else float("inf"))
            self.claims.pop(digest, None)
            return "ok", True
        mine = held is not None and held[0] == holder
        if op == "renew" and mine:
            self.claims[digest] = (holder, now + self.lease_seconds)
        elif op == "release" and mine:
            del self.claims[digest]
        return "ok", mine

    async def count(self, model: str, **increments: int) -> None:
        mine = self.counters.setdefault(model, dict.fromkeys(COUNTERS, 0))
        for name, n in increments.items():
            mine[name] += int(n)


def open_judge_cache(
    redis_url: str | None,
    keyspace: Keyspace,
    *,
    cluster: bool = False,
    shared: SharedSpace | None = None,
    **settings: object,
) -> _CacheBase:
    """The judge cache of a pipeline: fleet-wide on its Redis at ``redis_url`` (through a client of
    its own, closed by :meth:`~JudgeCache.close`); per process when there is no Redis. With
    ``shared``, answers are kept across namespaces (:mod:`rewardq.reward.judge.shared`); without a
    Redis that cannot be, and the process keeps them."""
    if redis_url is None:
        return LocalJudgeCache(**settings)
    from rewardq.queue.connection import connect_async

    client = connect_async(redis_url, cluster=cluster)
    return JudgeCache(client, keyspace, owns_redis=True, shared=shared, **settings)


def judge_totals(r: SyncRedis, ks: Keyspace) -> dict[str, dict[str, Any]]:
    """The fleet's judge counters per model (``rewardq status``), read with a blocking client:
    ``{model: {requests, errors, failed, answers, cache_hits, prompt_tokens, completion_tokens,
    error_rate}}``; ``error_rate`` is the share of requests that failed (a status other than 200,
    a connection error or a timeout)."""
    return totals_from_fields(r.hgetall(ks.judge_stats))


def totals_from_fields(fields: Mapping[Any, Any]) -> dict[str, dict[str, object]]:
    """:func:`judge_totals` of an already-read ``<ns>:judge-stats`` hash."""
    out: dict[str, dict[str, Any]] = {}
    for raw_name, raw_value in fields.items():
        counter, sep, model = as_text(raw_name).partition(":")
        if not sep or counter not in COUNTERS:
            continue
        try:
            value = int(as_text(raw_value))
        except ValueError:
            continue
        out.setdefault(model, dict.fromkeys(COUNTERS, 0))[counter] = value
    for st in out.values():
        st["error_rate"] = round(st["errors"] / st["requests"], 4) if st["requests"] else 0.0
    return dict(sorted(out.items()))


async def seed_answers(redis_url: str, keyspace: Keyspace, answers: Mapping[str, str], ttl: float) -> int:
    """Put answers (request digest -> answer) into a namespace's answer cache, each kept ``ttl``
    seconds (0: no expiry), through a client of its own; returns how many (``rewardq replay`` seeds
    the cache with the answers its ledger recorded)."""
    if not answers:
        return 0
    from rewardq.queue.connection import connect_async

    r = connect_async(redis_url)
    try:
        pipe = r.pipeline(transaction=False)
        for digest, answer in answers.items():
            pipe.hset(keyspace.judge(digest), "a", answer)
            if ttl > 0:
                pipe.expire(keyspace.judge(digest), int(ttl))
        await pipe.execute()
    finally:
        await r.aclose()
    return len(answers)
