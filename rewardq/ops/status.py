"""``rewardq status``: what is waiting for what, in one screen.

Renders :func:`rewardq.ops.overview.pipeline_status` (plus each shard's consumers, so entries
held by a worker that died show up) as rich tables:

* **shards**     stream length, consumer-group lag (entries never delivered; estimated as length
                 minus pending when Redis cannot tell), pending (delivered, not acknowledged) and
                 who holds them;
* **workers**    every live worker: host, pid, in-flight trajectories, heartbeat age, scored per
                 second, counters;
* **waiting**    trajectories still collecting outputs, oldest first, with the missing indices,
                 how long they have waited and when they will be given up (and how many entries
                 their shard's stream still holds unread: a draining backlog, not a missing output);
* **waiting on a retry** trajectories whose scoring failed for a transient reason (a judge or
                 sandbox that is down), soonest first: tries, next try, time left, and why;
* **error results by kind** per data source (live workers, since they started): transient,
                 timeout, scorer, config, input;
* **code execution** per data source (live workers' counters): responses scored by outcome,
                 programs run, time spent, through SandboxFusion or the local runner;
* **dead letters** by kind, and the last minute's throughput and push-to-result latency;
* **diagnosis**  one line per thing an operator should act on, each saying what to do (the
                 commands to run on lines of their own).

The tables are drawn by :mod:`rewardq.ops.status_view`. ``--json`` prints the same data as one
JSON object. ``--watch [SECONDS]`` is the live view, ``rewardq top --interval SECONDS``
(:mod:`rewardq.ops.top`): there is one. Read-only.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from rewardq.ops.diagnosis import diagnose
from rewardq.ops.layout import WIDE_HELP, WIDE_WIDTH
from rewardq.ops.status_view import render_status
from rewardq.ops.target import opened, pipeline_options
from rewardq.ops.top import top
from rewardq.queue.reads import STATUS_WAITING_LIMIT

if TYPE_CHECKING:
    from rewardq.queue.clients import SyncRedis
    from rewardq.queue.keys import Keyspace

__all__ = ["status", "collect"]


def _s(v: object) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


def consumers(r: SyncRedis, ks: Keyspace) -> dict[int, list[dict[str, Any]]]:
    """Every shard's consumers: ``{shard: [{name, pending, idle_ms, inactive_ms}]}`` (empty without a group)."""
    from rewardq.queue.connection import ResponseError

    out: dict[int, list[dict[str, Any]]] = {}
    for s in range(ks.shards):
        try:
            info = r.xinfo_consumers(ks.stream(s), ks.group)
        except ResponseError:
            info = []
        out[s] = [
            {
                "name": _s(c.get("name", "")),
                "pending": int(c.get("pending", 0)),
                "idle_ms": int(c.get("idle", 0)),
                "inactive_ms": None if c.get("inactive") in (None, -1) else int(c["inactive"]),
            }
            for c in info
        ]
    return out


def collect(r: SyncRedis, ks: Keyspace, *, limit: int = STATUS_WAITING_LIMIT, url: str = "") -> dict[str, Any]:
    """The status dict ``--json`` prints: ``pipeline_status`` + consumers, owners, diagnosis."""
    from rewardq.ops.overview import pipeline_status

    st = pipeline_status(r, ks, waiting_limit=limit)
    live = {w["name"] for w in st["workers"]}
    cons = consumers(r, ks)
    for sh in st["shards"]:
        sh["owners"] = [
            {"name": c["name"], "pending": c["pending"], "alive": c["name"] in live}
            for c in cons.get(sh["shard"], [])
            if c["pending"]
        ]
    for w in st["workers"]:
        inactive = [
            c["inactive_ms"]
            for cs in cons.values()
            for c in cs
            if c["name"] == w["name"] and c["inactive_ms"] is not None
        ]
        w["inactive_s"] = round(min(inactive) / 1000, 1) if inactive else None
        w["pending"] = sum(c["pending"] for cs in cons.values() for c in cs if c["name"] == w["name"])
    lag = {sh["shard"]: int(sh["backlog"]) for sh in st["shards"]}
    for w in st["waiting"]:  # its missing outputs are most likely among its shard's unread entries
        w["behind_backlog"] = lag.get(w["shard"], 0) if (w["missing"] or w["final"] is None) else 0
    st["redis_url"] = url
    st["shard_count"] = ks.shards
    st["diagnosis"] = diagnose(st)
    return st


@click.command()
@pipeline_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--watch",
    type=click.FloatRange(min=0.1),
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="The live view: runs `rewardq top --interval SECONDS` (default 2).",
)
@click.option("--count", type=click.IntRange(min=1), default=None, help="With --watch: top's --count.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=STATUS_WAITING_LIMIT,
    show_default=True,
    help="Waiting trajectories to list.",
)
@click.option("--wide", is_flag=True, help=WIDE_HELP)
@click.pass_context
def status(
    ctx: click.Context,
    redis_url: str,
    namespace: str,
    cluster: bool,
    group: str,
    as_json: bool,
    watch: float | None,
    count: int | None,
    limit: int,
    wide: bool,
) -> int:
    """Show streams, workers, trajectories waiting for outputs, dead letters and recent throughput.

    Exit code 0 (also when something is stuck: read the diagnosis lines); 1 when the namespace
    does not exist; 3 when Redis is unreachable. With --watch, what `rewardq top` exits with.
    """
    if watch is not None:
        options = {"redis_url": redis_url, "namespace": namespace, "cluster": cluster, "group": group}
        code: int = ctx.invoke(top, **options, interval=watch, count=count, as_json=as_json)
        return code
    from rich.console import Console

    console = Console(highlight=False, width=WIDE_WIDTH if wide else None)
    with opened(redis_url, namespace, cluster=cluster, group=group) as p:
        st = collect(p.client, p.ks, limit=limit, url=p.url)
    if as_json:
        click.echo(json.dumps(st))
    else:
        console.print(render_status(st, console=console, wide=wide))
    return 0
