"""``rewardq status``: what is waiting for what, in one screen.

Renders :func:`rewardq.ops.overview.pipeline_status` (plus each shard's consumers, so entries
held by a worker that died show up) as rich tables:

* **shards**     stream length, consumer-group lag (entries never delivered; estimated as length
                 minus pending when Redis cannot tell), pending (delivered, not acknowledged) and
                 who holds them;
* **workers**    every live worker: host, pid, in-flight trajectories, heartbeat age, scored per
                 second, counters;
* **waiting**    trajectories still collecting outputs, oldest first, with the missing indices,
                 how long they have waited and when they will be given up;
* **code execution** per data source (live workers' counters): responses scored by outcome,
                 programs run, time spent, through SandboxFusion or the local runner;
* **dead letters** by kind, and the last minute's throughput and push-to-result latency;
* **diagnosis**  one line per thing an operator should act on, each saying what to do.

``--json`` prints the same data as one JSON object (one per refresh with ``--watch``);
``--watch [SECONDS]`` refreshes until Ctrl-C (or ``--count`` refreshes). Read-only.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from rewardq import defaults
from rewardq.ops.diagnosis import diagnose
from rewardq.ops.layout import WIDE_HELP, WIDE_WIDTH, fmt_duration
from rewardq.ops.target import opened, pipeline_options

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console, RenderableType

    from rewardq.queue.clients import SyncRedis
    from rewardq.queue.keys import Keyspace

    #: How a status dict becomes what the console prints (``render_status``, or a view of it).
    Render = Callable[..., RenderableType]
    from rich.console import JustifyMethod

__all__ = ["status", "collect", "diagnose", "render_status"]


def _s(v: object) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


def consumers(r: SyncRedis, ks: Keyspace) -> dict[int, list[dict[str, Any]]]:
    """Every shard's consumers: ``{shard: [{name, pending, idle_ms, inactive_ms}]}`` (empty without a group)."""
    from rewardq.queue.redis_errors import ResponseError

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


def collect(r: SyncRedis, ks: Keyspace, *, limit: int = defaults.STATUS_WAITING_LIMIT, url: str = "") -> dict[str, Any]:
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
    st["redis_url"] = url
    st["shard_count"] = ks.shards
    st["diagnosis"] = diagnose(st)
    return st


_STYLE = {"error": "bold red", "warning": "yellow", "ok": "green"}


def render_status(
    st: dict[str, Any], footer: str | None = None, *, console: Console | None = None, wide: bool = False
) -> RenderableType:
    """The status dict as one rich renderable (tables and the diagnosis; ``footer`` under them).

    A table wider than ``console``'s width (80 columns when output is not a terminal) is shown as
    stacked blocks (:mod:`rewardq.ops.layout`) unless ``wide``: no name or key is ever cut.
    """
    from rich.console import Console, Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from rewardq.ops.layout import Column, table_or_stack

    console = console or Console(highlight=False)
    parts: list[Any] = []
    head = Text.assemble(
        (f"{time.strftime('%H:%M:%S', time.localtime(st['time']))}  {st['namespace']}", "bold"),
        f" on {st['redis_url']} (group {st['group']}, {st['shard_count']} shard(s))",
    )
    parts.append(head)
    if st.get("scoring"):
        parts.append(Text(f"scoring configuration {st['scoring']['digest']}: {st['scoring']['config']}", "dim"))

    shard_rows = []
    for sh in st["shards"]:
        owners = ", ".join(
            f"{o['name']}: {o['pending']}" + ("" if o["alive"] else " (not alive)") for o in sh.get("owners", [])
        )
        lag = str(sh["backlog"]) if sh["backlog_exact"] else f"≈{sh['backlog']}"
        shard_rows.append(
            [
                str(sh["shard"]),
                str(sh["length"]),
                lag,
                str(sh["pending"]),
                escape(owners or "-"),
                "[green]yes[/]" if sh["group"] else "[red]missing[/]",
            ]
        )
    right: JustifyMethod = "right"
    shard_cols = [
        Column("shard", right, lead=True),
        Column("length", right),
        Column("lag", right),
        Column("pending", right),
        Column("held by"),
        Column("group"),
    ]
    parts.append(table_or_stack(console, "streams", shard_cols, shard_rows, wide=wide))

    # "idle" (time since the worker last got an entry) needs XINFO CONSUMERS "inactive": Redis >= 7.2
    idle = any(w.get("inactive_s") is not None for w in st["workers"])
    worker_cols = [
        Column("name", lead=True),
        Column("host"),
        Column("pid", right),
        Column("in flight", right),
        Column("last beat", right),
        *([Column("idle", right)] if idle else []),
        Column("scored/s", right),
        Column("scored", right),
        Column("errors", right),
        Column("dead", right),
        Column("manager"),
        Column("up", right),
    ]  # entries each worker holds: the streams table's "held by"
    worker_rows = []
    for w in st["workers"]:
        beat = fmt_duration(w["idle_s"])
        worker_rows.append(
            [
                escape(w["name"]),
                escape(w["host"]),
                str(w["pid"]),
                str(w["in_flight"]),
                beat if w["idle_s"] < 10 else f"[yellow]{beat}[/]",
                *([fmt_duration(w.get("inactive_s"))] if idle else []),
                f"{w['rate_per_s']:g}",
                str(w["scored"]),
                f"[red]{w['errors']}[/]" if w["errors"] else "0",
                str(w["dead_letters"]),
                escape(w["manager"]),
                fmt_duration(w["uptime_s"]),
            ]
        )
    title = f"live workers ({len(st['workers'])})"
    parts.append(table_or_stack(console, title, worker_cols, worker_rows, wide=wide, empty="[red]none[/]"))

    shown = len(st["waiting"])
    title = (
        f"waiting for outputs ({st['waiting_total']}, oldest first"
        + (f", {shown} shown" if shown < st["waiting_total"] else "")
        + ")"
    )
    waiting_cols = [
        Column("trajectory", lead=True),
        Column("shard", right),
        Column("have"),
        Column("final", right),
        Column("missing"),
        Column("waiting for"),
        Column("waited", right),
        Column("given up in", right),
    ]
    waiting_rows = [
        [
            escape(w["tid"]),
            str(w["shard"]),
            ",".join(map(str, w["have"])) or "-",
            "?" if w["final"] is None else str(w["final"]),
            f"[red]{','.join(map(str, w['missing']))}[/]" if w["missing"] else "-",
            escape(w["waiting_for"]),
            fmt_duration(w["waited_s"]),
            fmt_duration(w["expires_in_s"]),
        ]
        for w in st["waiting"]
    ]
    parts.append(table_or_stack(console, title, waiting_cols, waiting_rows, wide=wide, empty="[green]none[/]"))

    if st.get("reward_health"):
        parts.append(health_table(st["reward_health"], console, wide))
    if st.get("code"):
        parts.append(_code_table(st["code"], console, wide))
    if st.get("judges"):
        parts.append(_judge_table(st["judges"], console, wide))

    rec = st["recent"]

    def lat(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f} ms"

    kinds = ", ".join(f"{k}: {n}" for k, n in sorted(st["dead_letters_by_kind"].items()))
    facts = Table(show_header=False, box=None, padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    b = st.get("backlog")
    if b is not None:
        drain = "never at this rate (nothing is scored)" if b["seconds"] is None else fmt_duration(b["seconds"])
        facts.add_row(
            "backlog",
            f"{b['entries']:,} entries" + ("" if b["exact"] else " (estimated)") + f", drains in {drain} at "
            f"{b['outputs_per_s']:g} outputs/s",
        )
    facts.add_row(
        "dead letters", (f"[red]{st['dead_letters']}[/] ({escape(kinds)})" if st["dead_letters"] else "[green]0[/]")
    )
    facts.add_row(
        f"last {rec['window_s']:g}s",
        f"{rec['trajectories']} trajectories finished ({rec['trajectories_per_s']:g}/s), {rec['errors']} with errors",
    )
    facts.add_row("latency", f"p50 {lat(rec['latency_ms_p50'])}, p99 {lat(rec['latency_ms_p99'])} (push to result)")
    if st.get("ledger"):
        facts.add_row("ledger", ledger_line(st["ledger"]))
    parts.append(facts)
    for d in st["diagnosis"]:
        parts.append(Text(("✔ " if d["level"] == "ok" else "! ") + d["message"], style=_STYLE[d["level"]]))
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)


def health_table(rows: list[dict[str, Any]], console: Console, wide: bool) -> RenderableType:
    """Per data source: the last 60 s against the 10 minutes before (rewardq.consumers.reward_health)."""
    from rich.markup import escape

    from rewardq.ops.layout import Column, table_or_stack

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else fmt.format(v)

    columns = [
        Column("data source", lead=True),
        Column("trajectories", "right"),
        Column("mean reward", "right"),
        Column("before", "right"),
        Column("errors", "right"),
        Column("by kind"),
        Column("p99", "right"),
        Column("jumped"),
    ]
    body = [
        [
            escape(r["data_source"]),
            str(r["trajectories"]),
            num(r["mean_reward"], "{:.3f}"),
            num(r["baseline_mean_reward"], "{:.3f}"),
            f"{r['error_share']:.1%}",
            escape(", ".join(f"{k} {v:.0%}" for k, v in r["errors_by_kind"].items()) or "-"),
            num(r["p99_ms"], "{:,.0f} ms"),
            f"[bold red]{escape('; '.join(r['jumps']))}[/]" if r["jumps"] else "[green]steady[/]",
        ]
        for r in rows
    ]
    title = "reward health (live workers: last 60 s; before: the 10 minutes before)"
    return table_or_stack(console, title, columns, body, wide=wide)


def ledger_line(ledger: dict[str, Any]) -> str:
    """The live workers' ledger in one line: where, rows written, what waits or failed."""
    from rich.markup import escape

    where = escape(", ".join(ledger["urls"]))
    line = f"{where}: {ledger['rows']:,} rows written by {ledger['workers']} worker(s)"
    if ledger["pending_bytes"]:
        line += f", {ledger['pending_bytes']:,} bytes spooled"
    if ledger["unwritten"]:
        line += f", [red]{ledger['unwritten']:,} trajectories not written[/]"
    if ledger["failing"]:
        line += f", [red]failing on {escape(', '.join(sorted(ledger['failing'])))}[/]"
    return line


def _code_table(code: dict[str, Any], console: Console, wide: bool) -> RenderableType:
    """Code execution per data source, summed over live workers."""
    from rich.markup import escape

    from rewardq.ops.layout import Column, table_or_stack

    heads = ("data source", "backend", "scored", "passed", "errors", "programs", "seconds", "s/program", "outcomes")
    columns = [
        Column(h, "left" if h in ("data source", "backend", "outcomes") else "right", lead=h == "data source")
        for h in heads
    ]
    rows = []
    for ds, c in code.items():
        statuses = c.get("statuses", {})
        errors = statuses.get("error", 0)
        rows.append(
            [
                escape(ds),
                escape(c.get("backend", "")),
                str(c.get("trajectories", 0)),
                str(statuses.get("passed", 0)),
                f"[red]{errors}[/]" if errors else "0",
                str(c.get("runs", 0)),
                f"{c.get('seconds', 0.0):.1f}",
                f"{c['seconds'] / c['runs']:.3f}" if c.get("runs") else "-",
                escape(", ".join(f"{k}: {n}" for k, n in sorted(statuses.items()))),
            ]
        )
    return table_or_stack(console, "code execution (live workers)", columns, rows, wide=wide)


def _judge_table(judges: dict[str, Any], console: Console, wide: bool) -> RenderableType:
    """LLM-judge calls per model, for the whole fleet (counters kept in Redis)."""
    from rich.markup import escape

    from rewardq.ops.layout import Column, table_or_stack

    headers = (
        "model",
        "requests",
        "answers",
        "cache hits",
        "errors",
        "error rate",
        "gave up",
        "prompt tok",
        "compl. tok",
    )
    columns = [Column(h, "left" if h == "model" else "right", lead=h == "model") for h in headers]
    rows = []
    for model, j in judges.items():
        rate = j.get("error_rate", 0.0)
        rows.append(
            [
                escape(model),
                f"{j.get('requests', 0):,}",
                f"{j.get('answers', 0):,}",
                f"{j.get('cache_hits', 0):,}",
                f"[red]{j['errors']:,}[/]" if j.get("errors") else "0",
                f"[red]{rate:.1%}[/]" if rate else "0.0%",
                f"[red]{j['failed']:,}[/]" if j.get("failed") else "0",
                f"{j.get('prompt_tokens', 0):,}",
                f"{j.get('completion_tokens', 0):,}",
            ]
        )
    return table_or_stack(console, "LLM judges (fleet)", columns, rows, wide=wide)


@click.command()
@pipeline_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (one per refresh with --watch).")
@click.option(
    "--watch",
    type=click.FloatRange(min=0.1),
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="Refresh every SECONDS (default 2) until Ctrl-C.",
)
@click.option("--count", type=click.IntRange(min=1), default=None, help="With --watch: stop after this many refreshes.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=defaults.STATUS_WAITING_LIMIT,
    show_default=True,
    help="Waiting trajectories to list.",
)
@click.option("--wide", is_flag=True, help=WIDE_HELP)
def status(
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
    does not exist; 3 when Redis is unreachable.
    """
    from rich.console import Console

    console = Console(highlight=False, width=WIDE_WIDTH if wide else None)
    with opened(redis_url, namespace, cluster=cluster, group=group) as p:

        def snapshot() -> dict[str, Any]:
            return collect(p.client, p.ks, limit=limit, url=p.url)

        def render(st: dict[str, Any], footer: str | None = None) -> RenderableType:
            return render_status(st, footer, console=console, wide=wide)

        if watch is None:
            _emit(console, snapshot(), as_json, render)
            return 0
        return _watch(console, snapshot, watch, count, as_json, render)


def _emit(console: Console, st: dict[str, Any], as_json: bool, render: Render) -> None:
    if as_json:
        click.echo(json.dumps(st))
    else:
        console.print(render(st))


def _watch(
    console: Console,
    snapshot: Callable[[], dict[str, Any]],
    every: float,
    count: int | None,
    as_json: bool,
    render: Render,
) -> int:
    """Refresh until Ctrl-C or ``count`` frames: a live screen in a terminal, frames one after another otherwise."""
    frames = 0
    try:
        if as_json or not console.is_terminal:
            while True:
                _emit(console, snapshot(), as_json, render)
                frames += 1
                if count is not None and frames >= count:
                    return 0
                if not as_json:
                    console.rule()
                time.sleep(every)
        from rich.live import Live

        footer = f"refreshing every {every:g}s; Ctrl-C to stop"
        with Live(render(snapshot(), footer), console=console, auto_refresh=False, screen=False) as live:
            frames = 1
            while count is None or frames < count:
                time.sleep(every)
                live.update(render(snapshot(), footer), refresh=True)
                frames += 1
        return 0
    except KeyboardInterrupt:  # Ctrl-C is how a watch ends: not an error
        return 0
