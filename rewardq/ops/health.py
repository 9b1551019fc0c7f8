"""``rewardq health``: is this worker alive and able to work? (container and orchestrator health checks)

Healthy means all of:

1. **Redis is reachable** (else exit 3, with the redacted URL and a hint);
2. **the namespace exists** (``<ns>:meta``) and **every shard's stream has the consumer group**:
   without the group no worker can read (a Redis restarted without persistence loses it);
3. **a heartbeat is fresh**: a worker re-writes ``<ns>:worker:<name>`` and its score in the
   ``<ns>:workers`` sorted set every ``heartbeat_interval`` seconds; at least one worker that
   matches must have beaten within ``--max-age`` seconds. Which workers match:

   * default: those whose ``host`` is this machine's hostname. In a container the hostname is
     the container's, so ``HEALTHCHECK CMD rewardq health`` checks exactly the workers of that
     container (one, or the N children of ``--processes N``);
   * ``--name NAME``: that one worker (``--name`` given to ``rewardq worker``; with
     ``--processes N`` the children are ``NAME-0`` ... ``NAME-<N-1>``);
   * ``--any-host``: any worker of the namespace (is anyone scoring at all?).

Exit code 0 when healthy; 1 when not (one line per failed check on stderr, naming the workers
seen and how old their heartbeats are); 3 when Redis is unreachable. Orchestrators (Docker
``HEALTHCHECK``, Kubernetes exec probes) treat every non-zero code as unhealthy.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import click

from rewardq.ops.target import open_pipeline, pipeline_options
from rewardq.queue.results import as_text

if TYPE_CHECKING:
    from rewardq.queue.clients import SyncRedis
    from rewardq.queue.keys import Keyspace

__all__ = ["Check", "HealthReport", "check_health", "health"]

#: Seconds a worker's last heartbeat may be old for it to count as alive (``rewardq health``,
#: ``rewardq demo`` waiting for its workers).
HEALTH_MAX_AGE = 10.0


_s = as_text


@dataclass
class Check:
    """One health condition: its name, whether it holds, and what was seen."""

    name: str
    ok: bool
    detail: str


@dataclass
class HealthReport:
    """The outcome of one health check.

    Attributes:
        local: matching workers with a fresh heartbeat, ``(name, seconds since the last beat)``.
        stale: matching workers whose last beat is older than ``max_age``.
        others: live workers that do not match (other hosts / names).
    """

    namespace: str
    host: str
    target: str
    checks: list[Check] = field(default_factory=list)
    local: list[tuple[str, float]] = field(default_factory=list)
    stale: list[tuple[str, float]] = field(default_factory=list)
    others: int = 0

    @property
    def healthy(self) -> bool:
        return all(c.ok for c in self.checks)

    def message(self, namespace: str | None = None) -> str:
        if self.healthy:
            return "healthy: " + "; ".join(c.detail for c in self.checks)
        return "unhealthy: " + "; ".join(c.detail for c in self.checks if not c.ok)

    def as_dict(self) -> dict[str, object]:
        return {
            "healthy": self.healthy,
            "namespace": self.namespace,
            "host": self.host,
            "target": self.target,
            "checks": [asdict(c) for c in self.checks],
            "workers": [{"name": n, "age_s": round(a, 1)} for n, a in self.local],
            "stale": [{"name": n, "age_s": round(a, 1)} for n, a in self.stale],
            "others": self.others,
            "message": self.message(),
        }


def _group_check(client: SyncRedis, ks: Keyspace) -> Check:
    from rewardq.queue.connection import ResponseError

    missing = []
    for s in range(ks.shards):
        try:
            names = {_s(g.get("name")) for g in client.xinfo_groups(ks.stream(s))}
        except ResponseError:  # no stream at all
            names = set()
        if ks.group not in names:
            missing.append(s)
    if missing:
        return Check(
            "group",
            False,
            f"consumer group {ks.group!r} is missing on shard(s) "
            f"{','.join(map(str, missing))} of namespace {ks.namespace!r} (a worker creates it at start-up; "
            "a Redis restarted without persistence loses it): restart the workers",
        )
    return Check("group", True, f"group {ks.group!r} on {ks.shards} shard(s)")


def check_health(
    client: SyncRedis,
    namespace: str,
    *,
    max_age: float = HEALTH_MAX_AGE,
    host: str | None = None,
    name: str | None = None,
    any_host: bool = False,
    ks: Keyspace | None = None,
) -> HealthReport:
    """Run every check against ``namespace`` (Redis is known to answer).

    Args:
        client: a blocking ``redis.Redis`` (or cluster) client.
        namespace: the pipeline's namespace.
        max_age: a heartbeat is fresh when at most this many seconds old.
        host: the hostname whose workers count (default ``socket.gethostname()``).
        name: check this one worker instead of a host's.
        any_host: any worker of the namespace counts.
        ks: the namespace's :class:`~rewardq.queue.keys.Keyspace` (default: read ``<ns>:meta``).
    """
    from rewardq.queue.keys import Keyspace

    host = host or socket.gethostname()
    target = f"worker {name!r}" if name else "any worker" if any_host else f"a worker on host {host}"
    report = HealthReport(namespace, host, target)
    if ks is None:
        shards = client.hget(Keyspace(namespace).meta, "shards")
        ks = Keyspace(namespace, int(shards)) if shards is not None else None
    if ks is None:
        report.checks.append(
            Check(
                "namespace",
                False,
                f"namespace {namespace!r} does not exist (no {namespace}:meta): "
                "no worker has ever started on it; check --namespace and --redis-url",
            )
        )
        return report
    report.checks.append(_group_check(client, ks))
    now = time.time()
    beats = client.zrange(ks.workers, 0, -1, withscores=True)
    pipe = client.pipeline(transaction=False)
    for raw_name, _ in beats:
        pipe.hget(ks.worker(_s(raw_name)), "host")
    for (raw_name, beat), their_host in zip(beats, pipe.execute() if beats else []):
        n, age = _s(raw_name), max(0.0, now - beat)
        alive = age <= max_age and their_host is not None  # an expired heartbeat hash: the worker is gone
        matches = n == name if name else any_host or (their_host is not None and _s(their_host) == host)
        if not matches:
            report.others += alive
        elif alive:
            report.local.append((n, age))
        else:
            report.stale.append((n, age))
    report.local.sort()
    report.stale.sort()
    if report.local:
        shown = ", ".join(f"{n} ({a:.1f}s ago)" for n, a in report.local)
        report.checks.append(
            Check("heartbeat", True, f"{len(report.local)} live worker(s) in namespace {namespace!r}: {shown}")
        )
    else:
        stale = ", ".join(f"{n} (last beat {a:.0f}s ago)" for n, a in report.stale)
        report.checks.append(
            Check(
                "heartbeat",
                False,
                (
                    f"no fresh heartbeat (within {max_age:g}s) from {target} in namespace {namespace!r}"
                    + (f"; stale: {stale}" if stale else "")
                    + f"; {report.others} live worker(s) elsewhere. Is "
                    "`rewardq worker` running here with this --namespace and --redis-url, and not stuck?"
                ),
            )
        )
    return report


@click.command()
@pipeline_options
@click.option(
    "--max-age",
    type=click.FloatRange(min=0, min_open=True),
    default=HEALTH_MAX_AGE,
    show_default=True,
    help="Seconds since a worker's last heartbeat for it to count as alive.",
)
@click.option("--name", default=None, help="Check this worker (its --name) instead of this host's workers.")
@click.option("--any-host", is_flag=True, help="Any live worker of the namespace counts.")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as one JSON object.")
def health(
    redis_url: str,
    namespace: str,
    cluster: bool,
    group: str,
    max_age: float,
    name: str | None,
    any_host: bool,
    as_json: bool,
) -> int:
    """Exit 0 if Redis answers, the group exists and a worker here sent a heartbeat recently (health checks).

    Exit code 1 when unhealthy, 3 when Redis is unreachable.
    """
    if name and any_host:
        from rewardq.errors import ConfigError

        raise ConfigError("give --name or --any-host, not both")
    p = open_pipeline(redis_url, namespace, cluster=cluster, group=group, require=False)
    try:
        exists = p.client.exists(p.ks.meta)
        report = check_health(
            p.client, namespace, max_age=max_age, name=name, any_host=any_host, ks=p.ks if exists else None
        )
    finally:
        p.close()
    report.checks.insert(0, Check("redis", True, f"Redis at {p.url} answers"))
    if as_json:
        click.echo(json.dumps(report.as_dict()))
    else:
        click.echo(report.message(), err=not report.healthy)
    return 0 if report.healthy else 1
