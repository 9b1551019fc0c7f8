"""``rewardq health``: is a worker on *this host* alive? (for container health checks)

Every worker beats its heart: it re-writes ``<ns>:worker:<name>`` (with ``host``, ``pid``,
counters) and its score in the ``<ns>:workers`` sorted set every ``heartbeat_interval``
seconds. A host is healthy when at least one worker whose ``host`` is this machine's
hostname has beaten within ``max_age`` seconds. In a container the hostname is the
container's, so ``HEALTHCHECK CMD rewardq health`` checks exactly the workers of that
container (one, or the N children of ``--processes N``).

Exit code 0 when healthy, 1 when not (the message says which workers were seen), 3 when
Redis is unreachable.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["HealthReport", "check_health"]


@dataclass
class HealthReport:
    """The outcome of one check: this host's live workers, and every live worker seen."""

    host: str
    local: list[tuple[str, float]]  # (name, seconds since its last beat)
    others: int

    @property
    def healthy(self) -> bool:
        return bool(self.local)

    def message(self, namespace: str) -> str:
        if self.local:
            shown = ", ".join(f"{name} ({age:.1f}s ago)" for name, age in self.local)
            return f"healthy: {len(self.local)} live worker(s) on {self.host} in namespace {namespace}: {shown}"
        return (f"unhealthy: no worker on host {self.host} has sent a heartbeat to namespace {namespace} recently "
                f"({self.others} live worker(s) on other hosts); is `rewardq worker` running here with this "
                "--namespace and --redis-url?")


def check_health(client: Any, namespace: str, *, max_age: float = 10.0, host: str | None = None) -> HealthReport:
    """Look for live workers of ``host`` (default: this machine) in ``namespace``.

    Args:
        client: a blocking ``redis.Redis`` client.
        namespace: the pipeline's namespace.
        max_age: a worker is live when its last heartbeat is at most this many seconds old.
        host: the hostname to check (default ``socket.gethostname()``).
    """
    from rewardq.queue.keys import Keyspace

    ks = Keyspace(namespace)
    host = host or socket.gethostname()
    now = time.time()
    live = client.zrangebyscore(ks.workers, now - max_age, "+inf", withscores=True)
    if not live:
        return HealthReport(host, [], 0)
    pipe = client.pipeline(transaction=False)
    for name, _ in live:
        pipe.hget(ks.worker(name.decode() if isinstance(name, bytes) else name), "host")
    local, others = [], 0
    for (name, beat), their_host in zip(live, pipe.execute()):
        name = name.decode() if isinstance(name, bytes) else name
        their_host = their_host.decode() if isinstance(their_host, bytes) else their_host
        if their_host == host:
            local.append((name, max(0.0, now - beat)))
        else:
            others += 1
    return HealthReport(host, sorted(local), others)
