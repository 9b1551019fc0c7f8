"""The end-of-run report: what was scored, how fast, and whether anything went missing.

:func:`summarize` turns the trajectories a command pushed and the results it read back into
one plain dict (printed as JSON by ``--json``); :func:`render` draws it as rich tables.

Per trajectory the report uses the result of its **final** key (the one the manager scored;
the others are copies): its reward, its ``reward_extra_info["acc"]`` (accuracy; a trajectory
without ``acc`` counts as correct when its reward is positive) and its ``latency_ms`` (from
the producer's push to the worker's commit). A trajectory is *missing* when any of its keys
has no result, an *error* when its final key holds an error result.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["Pushed", "summarize", "render", "percentile"]


@dataclass
class Pushed:
    """One trajectory a command pushed: its keys, its data source, and the reward it should get."""

    keys: list[str]
    data_source: str
    expected: float | None = None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _accurate(result: Any) -> bool:
    acc = (result.reward_extra_info or {}).get("acc")
    if acc is None:
        return (result.reward_score or 0.0) > 0
    return bool(acc) and acc not in ("False", "false", "0")


def summarize(
    pushed: Iterable[Pushed], results: Mapping[str, Any], *, elapsed_s: float, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Summarise a run.

    Args:
        pushed: the trajectories pushed.
        results: ``{key: RewardResult or None}`` for every pushed key.
        elapsed_s: seconds from the first push to the last result (throughput's denominator).
        extra: anything else to report (mode, workers, start-up time); copied in as is.

    Returns:
        A JSON-ready dict: ``trajectories``, ``outputs``, ``scored``, ``errors``, ``missing``,
        ``missing_keys`` (up to 20), ``error_samples`` (up to 5), ``by_data_source``
        (``count``, ``mean_reward``, ``accuracy``), ``elapsed_s``, ``trajectories_per_s``,
        ``outputs_per_s``, ``latency_ms`` (``p50``, ``p99``), ``by_worker`` and, when
        expected rewards were given, ``expected`` (``checked``, ``mismatched``, ``samples``).
    """
    pushed = list(pushed)
    groups: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    latencies: list[float] = []
    by_worker: Counter[str] = Counter()
    missing_keys: list[str] = []
    errors: list[str] = []
    mismatches: list[dict[str, Any]] = []
    n_missing = n_scored = n_checked = 0
    for p in pushed:
        absent = [k for k in p.keys if results.get(k) is None]
        if absent:
            n_missing += 1
            missing_keys.extend(absent)
            continue
        final = results[p.keys[-1]]
        by_worker[final.worker or "?"] += 1
        if final.latency_ms is not None:
            latencies.append(final.latency_ms)
        if not final.ok:
            errors.append(f"{p.keys[-1]}: {final.error}")
            continue
        n_scored += 1
        score = float(final.reward_score or 0.0)
        groups[p.data_source].append((score, _accurate(final)))
        if p.expected is not None:
            n_checked += 1
            wrong = [k for k in p.keys if results[k].reward_score != p.expected]
            if wrong:
                mismatches.append({"key": wrong[0], "expected": p.expected, "got": results[wrong[0]].reward_score})
    elapsed_s = max(elapsed_s, 1e-9)
    n_outputs = sum(len(p.keys) for p in pushed)
    out: dict[str, Any] = {
        **(extra or {}),
        "trajectories": len(pushed),
        "outputs": n_outputs,
        "scored": n_scored,
        "errors": len(errors),
        "missing": n_missing,
        "missing_keys": missing_keys[:20],
        "error_samples": errors[:5],
        "by_data_source": {
            ds: {
                "count": len(v),
                "mean_reward": round(sum(s for s, _ in v) / len(v), 4),
                "accuracy": round(sum(1 for _, a in v if a) / len(v), 4),
            }
            for ds, v in sorted(groups.items())
        },
        "elapsed_s": round(elapsed_s, 3),
        "trajectories_per_s": round(len(pushed) / elapsed_s, 1),
        "outputs_per_s": round(n_outputs / elapsed_s, 1),
        "latency_ms": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)},
        "by_worker": dict(sorted(by_worker.items())),
    }
    if n_checked:
        out["expected"] = {"checked": n_checked, "mismatched": len(mismatches), "samples": mismatches[:5]}
    return out


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f} ms"


def render(summary: Mapping[str, Any], console: Console, *, title: str = "rewardq: summary") -> None:
    """Print ``summary`` (from :func:`summarize`) as two rich tables on ``console``."""
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[italic]{title}[/]", soft_wrap=True)  # its own line: never wrapped or padded to the table
    by_ds = Table()
    by_ds.add_column("data source")
    by_ds.add_column("trajectories", justify="right")
    by_ds.add_column("mean reward", justify="right")
    by_ds.add_column("accuracy", justify="right")
    for ds, row in summary["by_data_source"].items():
        by_ds.add_row(escape(ds), str(row["count"]), f"{row['mean_reward']:.3f}", f"{row['accuracy']:.1%}")
    console.print(by_ds)

    t = Table(show_header=False, box=None, padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    for key in ("mode", "workers", "namespace"):
        if key in summary:
            t.add_row(key, escape(str(summary[key])))
    t.add_row("trajectories", f"{summary['trajectories']:,} ({summary['outputs']:,} outputs)")
    t.add_row("scored", f"{summary['scored']:,}")
    style = "red" if summary["errors"] or summary["missing"] else "green"
    t.add_row("errors", f"[{style}]{summary['errors']} error results, {summary['missing']} without a result[/]")
    t.add_row(
        "throughput",
        f"{summary['trajectories_per_s']:,.1f} trajectories/s, "
        f"{summary['outputs_per_s']:,.1f} outputs/s over {summary['elapsed_s']:.2f} s",
    )
    lat = summary["latency_ms"]
    t.add_row("latency", f"p50 {_fmt_ms(lat['p50'])}, p99 {_fmt_ms(lat['p99'])} (push to result)")
    if summary.get("by_worker"):
        t.add_row("by worker", escape(", ".join(f"{w}: {n}" for w, n in summary["by_worker"].items())))
    if "startup_s" in summary:
        t.add_row("worker start-up", f"{summary['startup_s']:.2f} s (not counted in throughput)")
    if "expected" in summary:
        e = summary["expected"]
        ok = "green" if not e["mismatched"] else "red"
        t.add_row("check", f"[{ok}]{e['checked'] - e['mismatched']}/{e['checked']} rewards equal the expected value[/]")
    console.print(t)
    for line in summary.get("error_samples", []):
        console.print(f"[red]error:[/] {escape(line)}", soft_wrap=True)
    if summary.get("missing_keys"):
        console.print(
            f"[red]no result for:[/] {escape(', '.join(summary['missing_keys']))}"
            + (" ..." if summary["missing"] > len(summary["missing_keys"]) else ""),
            soft_wrap=True,
        )
