"""``rewardq diff`` and ``rewardq report``: the ledger's read-only commands (docs/ledger.md).

Thin doors: :mod:`rewardq.ledger.diff` and :mod:`rewardq.ledger.report` do the work.
``rewardq replay``, which runs a worker, lives in :mod:`rewardq.replay`.
"""

from __future__ import annotations

import json
from typing import Any

import click

from rewardq.exit_codes import EXIT_CONFIG
from rewardq.ledger.diff import DIFF_TOP
from rewardq.ops.layout import WIDE_HELP, WIDE_WIDTH, Column, table_or_stack
from rewardq.queue.states import NO_DATA_SOURCE

__all__ = ["diff", "report", "trajectory_filters", "where_filters"]


def where_filters(f: Any) -> Any:
    """``--where``, ``--since`` and ``--until``: which rows of a ledger a command reads."""
    return _filters(f, "rows", "")


def trajectory_filters(f: Any) -> Any:
    """``--where``, ``--since`` and ``--until`` for a command that takes whole trajectories (replay)."""
    return _filters(f, "trajectories with a row", " (the trajectory is taken whole)")


def _filters(f: Any, which: str, whole: str) -> Any:
    for option in reversed(
        [
            click.option(
                "--where",
                "where",
                multiple=True,
                metavar="COLUMN=VALUE",
                help=f"Only {which} whose COLUMN is VALUE{whole} (repeatable; a column given twice matches "
                "either value), e.g. --where data_source=openai/gsm8k.",
            ),
            click.option(
                "--since", default=None, metavar="TIME", help=f"Only {which} scored at or after TIME (ISO, UTC)."
            ),
            click.option("--until", default=None, metavar="TIME", help=f"Only {which} scored before TIME (ISO, UTC)."),
        ]
    ):
        f = option(f)
    return f


@click.command()
@click.argument("before", metavar="A")
@click.argument("after", metavar="B")
@click.option("--where", "where", multiple=True, metavar="COLUMN=VALUE", help="Only rows whose COLUMN is VALUE.")
@click.option("--top", type=click.IntRange(min=0), default=DIFF_TOP, show_default=True, help="Largest changes to list.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
def diff(before: str, after: str, where: tuple[str, ...], top: int, as_json: bool, wide: bool) -> int:
    """Compare ledger A with ledger B (or a ledger with its replay) key by key.

    Counts keys compared, changed, newly failed (ok in A, an error in B) and newly scored; per data
    source the mean reward before and after; and the largest changes with both rewards and the
    decoded response. Keys in one ledger only (e.g. what a replay left out: incomplete, unreadable,
    not selected, past --limit) are counted as only in A / only in B, never as changed.

    Exit code 0; 2 when nothing was compared (a ledger with no rows for these filters, or no key in
    both), with a warning on stderr and the comparison still printed, or for a ledger that does not
    exist.
    """
    from rewardq.ledger.diff import compare, nothing_compared
    from rewardq.ledger.read import parse_where

    result = compare(before, after, where=parse_where(where), top=top)
    if as_json:
        click.echo(json.dumps(result, default=str))
    else:
        from rich.console import Console

        console = Console(highlight=False, width=WIDE_WIDTH if wide else None)
        console.print(render_diff(result, console, wide=wide))
    warning = nothing_compared(result)
    if warning:
        click.echo(f"warning: {warning}", err=True)
        return EXIT_CONFIG
    return 0


def render_diff(d: dict[str, Any], console: Any, *, wide: bool = False) -> Any:
    """The comparison as tables, stacked when wider than ``console`` (``wide``: never), so no data
    source or key is cut (:func:`~rewardq.ops.layout.table_or_stack`)."""
    from rich.console import Group
    from rich.markup import escape

    def mean(v: float | None) -> str:
        return "-" if v is None else f"{v:.4f}"

    head = (
        f"[bold]{d['compared']:,}[/] keys compared, [bold]{d['changed']:,}[/] changed, "
        f"{d['newly_failed']:,} newly failed, {d['newly_scored']:,} newly scored; "
        f"{d['only_before']:,} only in A, {d['only_after']:,} only in B"
    )
    numbers = ("compared", "changed", "newly failed", "newly scored", "mean before", "mean after")
    per_source = [
        [
            escape(ds or NO_DATA_SOURCE),
            *(f"{g[k]:,}" for k in ("compared", "changed", "newly_failed", "newly_scored")),
            mean(g["mean_before"]),
            mean(g["mean_after"]),
        ]
        for ds, g in d["by_data_source"].items()
    ]
    columns = [Column("data source", lead=True), *(Column(c, justify="right") for c in numbers)]
    parts: list[Any] = [head, table_or_stack(console, "per data source", columns, per_source, wide=wide)]
    if d["largest"]:
        largest = [
            [
                escape(c["key"]),
                escape(c["data_source"] or NO_DATA_SOURCE),
                f"{c['before']:g}",
                f"{c['after']:g}",
                escape((c["response"] or "")[-160:].replace("\n", " ")),
            ]
            for c in d["largest"]
        ]
        columns = [
            Column("key", lead=True),
            Column("data source"),
            Column("before", justify="right"),
            Column("after", justify="right"),
            Column("response (end)", wrap=True),
        ]
        parts.append(table_or_stack(console, "largest changes", columns, largest, wide=wide))
    for c in d.get("failed_examples", []):
        parts.append(f"[red]newly failed[/] {escape(c['key'])}: {escape(str(c.get('error') or ''))[:300]}")
    return Group(*parts)


@click.command()
@click.argument("source", metavar="LEDGER")
@click.option("-o", "--out", "out", required=True, metavar="REPORT.html", help="The HTML file to write.")
@where_filters
@click.option("--title", default=None, help="The report's title (default: the ledger's path).")
def report(
    source: str, out: str, where: tuple[str, ...], since: str | None, until: str | None, title: str | None
) -> int:
    """Write one self-contained HTML report of LEDGER: reward per data source over time, failures by
    kind, latency, response length against reward, slowest and most failing data sources.

    Needs the report extra (pip install 'rewardq[report]'). Exit code 0; 2 when LEDGER does not
    exist or has no rows (for the filters), -o names a folder that does not exist or a file that
    cannot be written, or the extra is missing.
    """
    from rewardq.ledger.read import parse_where
    from rewardq.ledger.report import write_report

    path = write_report(source, out, where=parse_where(where), since=since, until=until, title=title)
    click.echo(f"wrote {path}", err=True)
    return 0
