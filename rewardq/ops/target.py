"""Which pipeline an operator command looks at: the options that name it, and opening it.

``rewardq status``, ``inspect``, ``health`` and ``dead-letters`` all take the same three doors
(:func:`pipeline_options`, made from the worker's declarations of these settings): ``--redis-url``
(``REWARDQ_REDIS_URL``), ``--namespace`` (``REWARDQ_NAMESPACE``), ``--cluster``
(``REWARDQ_CLUSTER``), plus ``--group`` (``REWARDQ_GROUP``). :func:`open_pipeline` checks Redis
answers (exit 3 with a hint if not), reads the namespace's shard count from ``<ns>:meta`` and
refuses a namespace that does not exist, listing the ones that do: a typo in ``--namespace``
must not look like an idle pipeline.

Read-only: nothing here writes to Redis.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from rewardq.errors import NotFound
from rewardq.queue.connection import REDIS_URL, RedisError
from rewardq.queue.keys import GROUP, NAMESPACE

if TYPE_CHECKING:
    from rewardq.queue.clients import SyncRedis
    from rewardq.queue.keys import Keyspace

__all__ = [
    "Pipeline",
    "pipeline_options",
    "open_pipeline",
    "namespace_hint",
    "opened",
]

#: Seconds one-shot commands (``status``, ``inspect``, ``dead-letters``, ``health``, ``produce``)
#: wait for Redis before they exit with code 3.
ONESHOT_CONNECT_TIMEOUT = 5.0
#: Namespaces an error about an unknown ``--namespace`` lists (closest to the typed name first;
#: :func:`rewardq.queue.namespace.known_namespaces` bounds the SCAN that finds them).
NAMESPACES_LISTED = 20


DEFAULT_URL, DEFAULT_NAMESPACE, DEFAULT_GROUP = REDIS_URL, NAMESPACE, GROUP
_CONNECT_TIMEOUT = "rewardq.connect_timeout"


def _remember_connect_timeout(ctx: click.Context, _param: click.Parameter, value: float | None) -> None:
    ctx.meta[_CONNECT_TIMEOUT] = value


def connect_timeout() -> float:
    """The ``--connect-timeout`` of the running command (default ``ONESHOT_CONNECT_TIMEOUT``)."""
    ctx = click.get_current_context(silent=True)
    value = ctx.meta.get(_CONNECT_TIMEOUT) if ctx is not None else None
    return ONESHOT_CONNECT_TIMEOUT if value is None else float(value)


def pipeline_options(f: Callable[..., object]) -> Callable[..., object]:
    """The ``--redis-url``, ``--namespace``, ``--cluster``, ``--group`` and ``--connect-timeout``
    options of the operator commands (the last one is read by :func:`open_pipeline`, not passed).

    The first four are the worker's settings (:class:`~rewardq.config.WorkerConfig`: the same
    flag, variable, default and help); here click reads the variable itself, as these commands
    have no config file.
    """
    from rewardq.config import WorkerConfig
    from rewardq.ops.flags import setting_option

    known = WorkerConfig.settings()
    f = click.option(
        "--connect-timeout",
        type=click.FloatRange(min=0),
        default=None,
        envvar=known["connect_timeout"].env,
        expose_value=False,
        callback=_remember_connect_timeout,
        help=f"Seconds to wait for Redis, retrying with backoff (default {ONESHOT_CONNECT_TIMEOUT:g}).",
    )(f)
    for name in ("group", "cluster", "namespace", "redis_url"):
        s = known[name]
        f = setting_option(s, envvar=s.env, default=s.default)(f)
    return f


@dataclass
class Pipeline:
    """An open connection to one namespace: the blocking client, its keyspace, the redacted URL."""

    client: SyncRedis
    ks: Keyspace
    url: str  # password-redacted, safe to print
    cluster: bool = False

    def command(self, *words: str) -> str:
        """``rewardq <words>`` aimed at this pipeline, to print as a hint that runs as printed: with
        ``--namespace`` (and ``--redis-url``, ``--cluster``, ``--group``) unless they are the defaults.
        A URL holding a password is left out (it is never printed): such a hint runs where
        ``REWARDQ_REDIS_URL`` holds it."""
        import shlex

        flags: list[str] = []
        if self.url != DEFAULT_URL and "***" not in self.url:
            flags += ["--redis-url", self.url]
        if self.cluster:
            flags.append("--cluster")
        if self.ks.namespace != DEFAULT_NAMESPACE:
            flags += ["--namespace", self.ks.namespace]
        if self.ks.group != DEFAULT_GROUP:
            flags += ["--group", self.ks.group]
        return shlex.join(["rewardq", *words, *flags])

    def close(self) -> None:
        try:
            self.client.close()
        except (RedisError, OSError):  # closing is best effort
            pass


def namespace_hint(wanted: str, others: list[str], listed: int = NAMESPACES_LISTED) -> str:
    """What to say about a namespace that does not exist: the closest names first (a typo's
    intended name leads, however many namespaces the server holds), at most ``listed`` of them."""
    if not others:
        return "this server has no rewardq namespace at all"
    close = difflib.get_close_matches(wanted, others, n=3, cutoff=0.6)
    ranked = close + [n for n in others if n not in close]
    shown = ranked[:listed]
    more = f" and {len(ranked) - len(shown):,} more" if len(ranked) > len(shown) else ""
    mean = f"did you mean {close[0]!r}? " if close else ""
    return f"{mean}namespaces on this server: {', '.join(shown)}{more}"


def _shards(client: SyncRedis, namespace: str, url: str, require: bool) -> int | None:
    from rewardq.queue.keys import Keyspace
    from rewardq.queue.namespace import known_namespaces, shard_count

    probe = Keyspace(namespace)
    raw = shard_count(client, probe)
    if raw is None:
        if not require:
            return None
        hint = namespace_hint(namespace, [n for n in known_namespaces(client) if n != namespace])
        raise NotFound(
            f"namespace {namespace!r} does not exist on {url} (no {probe.meta} key: no producer or "
            f"worker has used it); {hint}. Check --namespace (REWARDQ_NAMESPACE) and --redis-url"
        )
    return int(raw)


def open_pipeline(
    redis_url: str, namespace: str, *, cluster: bool = False, group: str = DEFAULT_GROUP, require: bool = True
) -> Pipeline:
    """Connect to the pipeline ``namespace`` at ``redis_url``.

    Raises:
        RedisUnavailable: Redis does not answer within ``--connect-timeout`` (exit 3).
        RedisPermissionError: the ACL user may not read the namespace (exit 2).
        NotFound: ``require`` and the namespace has no ``<ns>:meta`` (exit 1); the message lists
            the namespaces that exist.
        ConfigError: the namespace name is invalid (exit 2).
    """
    from rewardq.errors import ConfigError
    from rewardq.queue.connection import connect_sync, redact_url, refusals_named
    from rewardq.queue.keys import Keyspace
    from rewardq.queue.reachability import wait_for_redis

    try:
        Keyspace(namespace, 1, group)
    except ValueError as exc:
        raise ConfigError(f"--namespace: {exc}") from None
    wait_for_redis(redis_url, cluster=cluster, timeout=connect_timeout())
    shown = redact_url(redis_url)
    client = connect_sync(redis_url, cluster=cluster)
    try:
        with refusals_named(namespace, redis_url):
            shards = _shards(client, namespace, shown, require)
    except BaseException:
        client.close()
        raise
    return Pipeline(client, Keyspace(namespace, shards or 1, group), shown, cluster=cluster)


@contextlib.contextmanager
def opened(
    redis_url: str, namespace: str, *, cluster: bool = False, group: str = DEFAULT_GROUP, require: bool = True
) -> Iterator[Pipeline]:
    """``with opened(...) as p:`` — :func:`open_pipeline`, closed on exit; a command the ACL user
    may not run inside becomes one :class:`~rewardq.errors.RedisPermissionError` line."""
    from rewardq.queue.connection import refusals_named

    p = open_pipeline(redis_url, namespace, cluster=cluster, group=group, require=require)
    try:
        with refusals_named(namespace, redis_url):
            yield p
    finally:
        p.close()
