"""``rewardq status``'s screen: the status dict (:func:`rewardq.ops.status.collect`) drawn as
rich tables, the facts under them and the diagnosis.

A table wider than the console is shown as stacked blocks (:mod:`rewardq.ops.layout`) unless
``--wide``; the diagnosis wraps its prose between words and puts every command on a line of its
own, so a command is never cut in two at 80 columns.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rewardq.consumers.reward_health import MIN_BASELINE, MIN_RECENT
from rewardq.ops.failures_view import failures_table, retrying_table
from rewardq.ops.layout import command_lines, fmt_duration

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod, RenderableType
    from rich.text import Text

__all__ = ["render_status", "health_table", "ledger_line", "diagnosis_lines"]

#: Columns a diagnosis's commands are indented by, under its prose.
INDENT = 4


_STYLE = {"error": "bold red", "warning": "yellow", "ok": "green"}


def render_status(st: dict[str, Any], *, console: Console | None = None, wide: bool = False) -> RenderableType:
    """The status dict as one rich renderable: the tables, then the diagnosis.

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
            escape(w["waiting_for"]) + (f" (behind {w['behind_backlog']:,} unread)" if w.get("behind_backlog") else ""),
            fmt_duration(w["waited_s"]),
            fmt_duration(w["expires_in_s"]),
        ]
        for w in st["waiting"]
    ]
    parts.append(table_or_stack(console, title, waiting_cols, waiting_rows, wide=wide, empty="[green]none[/]"))

    if st.get("retrying", {}).get("n"):
        parts.append(retrying_table(st["retrying"], console, wide))
    if any(any(kinds.values()) for kinds in st.get("failures", {}).values()):
        parts.append(failures_table(st["failures"], console, wide))
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
        f"{rec['trajectories']} trajectories finished ({rec['trajectories_per_s']:g}/s), {rec['errors']} with errors"
        + (f", {rec['cancelled']} cancelled" if rec.get("cancelled") else ""),
    )
    facts.add_row("latency", f"p50 {lat(rec['latency_ms_p50'])}, p99 {lat(rec['latency_ms_p99'])} (push to result)")
    if st.get("ledger"):
        facts.add_row("ledger", ledger_line(st["ledger"]))
    parts.append(facts)
    parts.extend(diagnosis_lines(st["diagnosis"], console.width))
    return Group(*parts)


def diagnosis_lines(diagnosis: list[dict[str, Any]], width: int) -> list[Text]:
    """Each diagnosis as its prose (wrapped between words), then each command it names on lines of
    its own, indented: one that does not fit ``width`` is continued with `` \\`` (copied as it is,
    it still runs), never cut where the prose wraps."""
    from rich.text import Text

    lines = []
    for d in diagnosis:
        lines.append(Text(("✔ " if d["level"] == "ok" else "! ") + d["message"], style=_STYLE[d["level"]]))
        for command in d.get("commands", ()):
            block = command_lines("", command, max(20, width - INDENT))
            lines.append(Text("\n".join(" " * INDENT + line for line in block.splitlines()), style="bold"))
    return lines


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
        Column("mean before", "right"),
        Column("errors", "right"),
        Column("errors before", "right"),
        Column("by kind"),
        Column("p99", "right"),
        Column("sharp change"),
    ]
    body = [
        [
            escape(r["data_source"]),
            str(r["trajectories"]),
            num(r["mean_reward"], "{:.3f}"),
            num(r["baseline_mean_reward"], "{:.3f}"),
            f"{r['error_share']:.1%}",
            f"{r['baseline_error_share']:.1%}" if r["baseline_trajectories"] else "-",
            escape(", ".join(f"{k} {v:.0%}" for k, v in r["errors_by_kind"].items()) or "-"),
            num(r["p99_ms"], "{:,.0f} ms"),
            _change(r),
        ]
        for r in rows
    ]
    title = "reward health (live workers: the last 60 s; mean and errors before: the 10 minutes before)"
    return table_or_stack(console, title, columns, body, wide=wide)


def _change(row: dict[str, Any]) -> str:
    """The health row's verdict: what changed sharply (red), ``none``, or ``too few to judge``
    (fewer trajectories than :func:`rewardq.consumers.reward_health.jumps` needs)."""
    from rich.markup import escape

    if row["jumps"]:
        return f"[bold red]{escape('; '.join(row['jumps']))}[/]"
    if row["trajectories"] < MIN_RECENT or row.get("baseline_trajectories", 0) < MIN_BASELINE:
        return "[dim]too few to judge[/]"
    return "[green]none[/]"


def ledger_line(ledger: dict[str, Any]) -> str:
    """The live workers' ledger in one line: where, rows written, what waits or failed. The counts
    are the live workers' own since each started (their heartbeats): a worker that stopped, or a
    restarted worker's earlier process, wrote rows that no count here holds."""
    from rich.markup import escape

    where = escape(", ".join(ledger["urls"]))
    n = ledger["workers"]
    who = "the live worker since it started" if n == 1 else f"the {n} live workers since each started"
    line = f"{where}: {ledger['rows']:,} rows written by {who}"
    if ledger["pending_bytes"]:
        line += f", {ledger['pending_bytes']:,} bytes spooled"
    if ledger["unwritten"]:
        line += f", [red]{ledger['unwritten']:,} trajectories not written[/]"
    if ledger.get("refused"):
        n = ledger["refused"]
        line += f", {n:,} key{'' if n == 1 else 's'} with no row by design"
        line += " (an index past int32, no readable record: docs/ledger.md)"
    if ledger.get("unreadable"):
        line += f", [red]{ledger['unreadable']:,} spooled frames unreadable (segments kept as *.wal.unreadable)[/]"
    if ledger["failing"]:
        line += f", [red]failing on {escape(', '.join(sorted(ledger['failing'])))}[/]"
    return line


def _code_table(code: dict[str, Any], console: Console, wide: bool) -> RenderableType:
    """Code execution per data source, summed over live workers."""
    from rich.markup import escape

    from rewardq.ops.layout import Column, table_or_stack

    heads = (
        "data source",
        "backend",
        "scored",
        "passed",
        "errors",
        "hacks",
        "programs",
        "seconds",
        "s/program",
        "outcomes",
        "tripwires",
    )
    columns = [
        Column(
            h, "left" if h in ("data source", "backend", "outcomes", "tripwires") else "right", lead=h == "data source"
        )
        for h in heads
    ]
    rows = []
    for ds, c in code.items():
        statuses = c.get("statuses", {})
        errors = statuses.get("error", 0)
        wires = c.get("tripwires", {})
        hacks = sum(wires.values())
        rows.append(
            [
                escape(ds),
                escape(c.get("backend", "")),
                str(c.get("trajectories", 0)),
                str(statuses.get("passed", 0)),
                f"[red]{errors}[/]" if errors else "0",
                f"[red]{hacks}[/]" if hacks else "0",
                str(c.get("runs", 0)),
                f"{c.get('seconds', 0.0):.1f}",
                f"{c['seconds'] / c['runs']:.3f}" if c.get("runs") else "-",
                escape(", ".join(f"{k}: {n}" for k, n in sorted(statuses.items()))),
                escape(", ".join(f"{k}: {n}" for k, n in sorted(wires.items()))) or "-",
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
        "saved tok",
        "errors",
        "error rate",
        "refused",
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
                f"{j.get('cache_hits', 0):,}" + (f" ({j['shared_hits']:,} shared)" if j.get("shared_hits") else ""),
                f"{j.get('saved_tokens', 0):,}",
                f"[red]{j['errors']:,}[/]" if j.get("errors") else "0",
                f"[red]{rate:.1%}[/]" if rate else "0.0%",
                f"[red]{j['failed']:,}[/]" if j.get("failed") else "0",
                f"{j.get('prompt_tokens', 0):,}",
                f"{j.get('completion_tokens', 0):,}",
            ]
        )
    return table_or_stack(console, "LLM judges (fleet)", columns, rows, wide=wide)
