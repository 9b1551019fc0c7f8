"""How the operator commands print: tables that never cut a name, durations and times.

The operator commands (``status``, ``inspect``, ``dead-letters list``) print worker names, pids,
keys and reasons that an operator copies into the next command, so none of them may be cut
mid-word or lose characters to an ellipsis. :func:`table_or_stack` renders the same rows either
as a rich table (when its natural width fits the console, or with ``--wide``) or, at 80
columns (the width when output is not a terminal), as one block per row::

    reward-worker-node17-0
        host vm · pid 4121 · in flight 3 · scored/s 12.5 · errors 0

where only the lines wrap, at the spaces between words. A single word longer than the whole
line (a very long key) is folded onto the next line, never shortened.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, Group, JustifyMethod, RenderableType

__all__ = ["Column", "table_or_stack", "natural_width", "WIDE_HELP", "fmt_duration", "fmt_age", "command_lines"]

WIDE_HELP = "Keep tables whole, however wide (default: a table wider than the terminal is shown as stacked blocks)."
#: What the console width is taken to be with ``--wide`` (tables are only as wide as their content).
WIDE_WIDTH = 1000


@dataclass(frozen=True)
class Column:
    """One column: its header and alignment; ``lead`` columns head each stacked block; a ``wrap``
    column (a reason) may wrap between its words, the others never wrap."""

    header: str
    justify: JustifyMethod = "left"
    lead: bool = False
    wrap: bool = False


def natural_width(console: Console, renderable: RenderableType) -> int:
    """The narrowest ``renderable`` can be without cutting a word (its wrap columns wrapped at words)."""
    from rich.measure import Measurement

    return int(Measurement.get(console, console.options.update(width=WIDE_WIDTH), renderable).minimum)


def table_or_stack(
    console: Console,
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    wide: bool = False,
    empty: str | None = None,
) -> RenderableType:
    """``rows`` (rich markup, one string per column) as a table if it fits ``console.width`` (or
    ``wide``), else as stacked blocks; ``empty`` is shown when there are no rows."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True)
    shown = [list(row) for row in rows] or ([[empty, *[""] * (len(columns) - 1)]] if empty is not None else [])
    for i, col in enumerate(columns):
        table.add_column(
            col.header,
            justify=col.justify,
            no_wrap=not col.wrap,
            overflow="fold" if col.wrap else "ellipsis",
            ratio=1 if col.wrap else None,
            # rich measures a no-wrap column by its longest *word*, so a table it says fits could
            # still cut "given up in": its whole longest cell is what the column needs
            min_width=None if col.wrap else _longest(col.header, [row[i] for row in shown]),
        )
    for row in shown:
        table.add_row(*row)
    if wide or natural_width(console, table) <= console.width:
        return table
    if not rows:  # headers wider than the line and nothing under them: say so in one line
        return _empty(title, empty)
    return _stacked(title, columns, rows)


def _longest(header: str, cells: Sequence[str]) -> int:
    """The widest of a header and its cells (rich markup), in terminal cells."""
    from rich.text import Text

    return max(Text.from_markup(x).cell_len for x in (header, *cells))


def _empty(title: str, empty: str | None) -> RenderableType:
    from rich.text import Text

    return Text.from_markup(f"[italic]{title}[/]" + (f": {empty}" if empty else ""), overflow="fold")


def _stacked(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> Group:
    from rich.console import Group
    from rich.padding import Padding
    from rich.text import Text

    leads = [i for i, c in enumerate(columns) if c.lead] or [0]
    parts: list[RenderableType] = [Text.from_markup(f"[italic]{title}[/]")]
    for row in rows:
        head = "  ".join(row[i] for i in leads if row[i])
        facts = [
            f"[dim]{columns[i].header}[/] {row[i]}"
            for i in range(len(columns))
            if i not in leads and row[i] not in ("", "-")
        ]
        parts.append(Padding(Text.from_markup(f"[bold]{head}[/]", overflow="fold"), (0, 0, 0, 2)))
        if facts:
            parts.append(Padding(Text.from_markup(" · ".join(facts), overflow="fold"), (0, 0, 0, 6)))
    return Group(*parts)


def fmt_duration(seconds: float | None) -> str:
    """``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def fmt_age(ts: float | None, now: float | None = None) -> str:
    """A unix time as ``2026-01-02 03:04:05 (4m05s ago)``; ``-`` for None or 0."""
    if not ts:
        return "-"
    now = time.time() if now is None else now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    return f"{stamp} ({fmt_duration(now - ts)} ago)" if now >= ts else stamp


def command_lines(label: str, command: str, width: int) -> str:
    """``label: command`` (``command`` alone when ``label`` is empty) in lines of at most ``width``
    columns, broken between words with a shell line continuation (`` \\``), so that the lines,
    copied as they are, run as one command."""
    import shlex

    words = [shlex.quote(w) for w in shlex.split(command)]
    lines, line = [], f"{label}: {words[0]}" if label else words[0]
    for word in words[1:]:
        if len(line) + 1 + len(word) + 2 > width:  # room for " \\"
            lines.append(line + " \\")
            line = "    " + word
        else:
            line += " " + word
    return "\n".join([*lines, line])
