"""Failures by kind and trajectories waiting on a retry, as ``rewardq status`` and ``rewardq top`` show them.

Both come from the live workers' heartbeats (:class:`~rewardq.consumers.presence.Presence`):

* :func:`failure_totals`: the error results the live workers wrote since they started, per data
  source and failure kind (``transient``, ``timeout``, ``scorer``, ``config``, ``input``);
* :func:`retry_totals`: the trajectories waiting on a retry in place right now (a judge or sandbox
  that is down), the soonest first, each with its worker, its data source, its tries, when it is
  scored again, how long its ``retry_for`` window has left, and why it failed.

:func:`failures_table` and :func:`retrying_table` render them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewardq.ops.layout import Column, fmt_duration, table_or_stack
from rewardq.queue.states import FailureKind

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

__all__ = ["failure_totals", "failures_table", "retry_totals", "retrying_table"]

#: Trajectories waiting on a retry that the views list, soonest first (the rest are counted).
RETRYING_LISTED = 20


def failure_totals(workers: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """``{data source: {failure kind: error results}}`` summed over ``workers`` (their heartbeats),
    every kind present for every data source (0 where none), data sources sorted."""
    out: dict[str, dict[str, int]] = {}
    for w in workers:
        for ds, kinds in (w.get("failures") or {}).items():
            if not isinstance(kinds, dict):
                continue
            row = out.setdefault(str(ds), dict.fromkeys(FailureKind, 0))
            for kind, n in kinds.items():
                if kind in row and isinstance(n, (int, float)):
                    row[FailureKind(kind)] += int(n)
    return {ds: {str(k): n for k, n in out[ds].items()} for ds in sorted(out)}


def retry_totals(workers: list[dict[str, Any]], listed: int = RETRYING_LISTED) -> dict[str, Any]:
    """``{"n": waiting on a retry, "waiting": [the soonest, each with its "worker"]}`` over ``workers``."""
    n, waiting = 0, []
    for w in workers:
        r = w.get("retrying") or {}
        n += int(r.get("n", 0)) if isinstance(r.get("n", 0), (int, float)) else 0
        waiting += [{**item, "worker": w["name"]} for item in r.get("waiting", []) if isinstance(item, dict)]
    waiting.sort(key=lambda item: float(item.get("next_in_s", 0.0)))
    return {"n": n, "waiting": waiting[:listed]}


def failures_table(failures: dict[str, dict[str, int]], console: Console, wide: bool) -> RenderableType:
    """Error results per data source and failure kind (live workers, since they started)."""
    from rich.markup import escape

    columns = [Column("data source", lead=True), *(Column(k.value, "right") for k in FailureKind)]
    rows = [
        [escape(ds), *(f"[red]{kinds.get(k, 0)}[/]" if kinds.get(k, 0) else "0" for k in FailureKind)]
        for ds, kinds in failures.items()
    ]
    return table_or_stack(console, "error results by kind (live workers, since they started)", columns, rows, wide=wide)


def retrying_table(retrying: dict[str, Any], console: Console, wide: bool) -> RenderableType:
    """The trajectories waiting on a retry, soonest first, with why."""
    from rich.markup import escape

    shown = len(retrying["waiting"])
    title = f"waiting on a retry ({retrying['n']}" + (f", {shown} shown" if shown < retrying["n"] else "") + ")"
    columns = [
        Column("trajectory", lead=True),
        Column("data source"),
        Column("worker"),
        Column("tries", "right"),
        Column("next in", "right"),
        Column("gives up in", "right"),
        Column("why"),
    ]
    rows = [
        [
            escape(str(w.get("tid", ""))),
            escape(str(w.get("data_source", "")) or "-"),
            escape(str(w.get("worker", ""))),
            str(w.get("retries", "")),
            fmt_duration(w.get("next_in_s")),
            fmt_duration(w.get("left_s")),
            f"[yellow]{escape(str(w.get('reason', '')))}[/]",
        ]
        for w in retrying["waiting"]
    ]
    return table_or_stack(console, title, columns, rows, wide=wide)
