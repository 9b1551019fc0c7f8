"""``rewardq report LEDGER -o report.html``: one self-contained HTML page of a ledger.

The page needs nothing but itself to open: its plots are PNG images drawn with matplotlib (the
``report`` extra; the Agg renderer, no display) and inlined as ``data:`` URLs, its style is inline,
and it has no script. What it shows, per trajectory (the final output's row: every key of a
trajectory has its reward; for a trajectory whose final output never arrived, its last output's,
so that every trajectory and failure is counted; a row without a time is on no time axis):

* a summary table per data source: trajectories, errors, error share, mean and standard deviation
  of the reward, latency p50 and p99;
* reward mean and spread (mean ± one standard deviation) per data source over time;
* failures by kind (``failure_kind``) over time;
* the latency distribution (push to result), and the time the manager took; a trajectory never
  scored (refused by a worker, or ended incomplete by ``incomplete_timeout``: an error row naming
  no provenance) is left out of every latency figure, and the page says how many there are;
* response length against reward, per data source;
* the slowest and the most failing data sources.

The numbers in the tables are computed from the same rows as the plots; each cell also carries
its exact value in a ``data-value`` attribute. Standard deviations are the population's (ddof=0:
over n, not n - 1), and labelled so: a data source or time bucket of one trajectory has 0.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rewardq.errors import ConfigError
from rewardq.ledger.read import Where, read_table
from rewardq.queue.states import NO_DATA_SOURCE

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_COLUMNS = ["key", "final", "data_source", "status", "failure_kind", "reward_score", "scored_at", "latency_ms"]
_COLUMNS += ["score_ms", "response_length", "provenance"]
#: Time buckets a report chooses from: the smallest giving at most ~60 buckets.
_BUCKETS = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
_MAX_POINTS = 20_000  # the response length scatter samples this many trajectories at most
_TOP = 10  # data sources listed in the slowest / most failing charts
_SIZE, _DPI = (9.0, 3.6), 110  # every figure, in inches and dots per inch


@dataclass
class Rows:
    """The final rows of a ledger, as arrays (one item per trajectory)."""

    data_source: np.ndarray
    ok: np.ndarray
    failure_kind: np.ndarray
    reward: np.ndarray  # NaN for errors
    t: np.ndarray  # scored_at, unix seconds
    latency_ms: np.ndarray  # NaN for a trajectory never scored (see never_scored)
    score_ms: np.ndarray
    length: np.ndarray
    unscored: np.ndarray  # never scored: refused by the intake or ended by incomplete_timeout

    @property
    def n(self) -> int:
        return int(self.t.shape[0])


def load(url: str, where: Where | None, since: str | None, until: str | None) -> Rows:
    """One row per trajectory of the ledger (see :func:`trajectory_rows`), as arrays."""
    table = read_table(url, where=where, since=since, until=until, columns=_COLUMNS)
    rows = trajectory_rows(table.to_pylist())
    if not rows:
        raise ConfigError(f"the ledger at {url} has no rows (for these filters): nothing to report")
    if all(r["scored_at"] is None for r in rows):
        raise ConfigError(f"no row of the ledger at {url} has a result time (scored_at): nothing to put on a time axis")

    def f(name: str) -> np.ndarray:
        return np.array([math.nan if r[name] is None else float(r[name]) for r in rows], dtype=float)

    unscored = np.array([never_scored(r) for r in rows], dtype=bool)
    latency = f("latency_ms")
    latency[unscored] = math.nan  # the wait of a refused or expired trajectory is no scoring latency
    return Rows(
        data_source=np.array([r["data_source"] or NO_DATA_SOURCE for r in rows], dtype=object),
        ok=np.array([r["status"] == "ok" for r in rows], dtype=bool),
        failure_kind=np.array([r["failure_kind"] or "unknown" for r in rows], dtype=object),
        reward=np.array(
            [r["reward_score"] if r["status"] == "ok" and r["reward_score"] is not None else math.nan for r in rows],
            dtype=float,
        ),
        t=np.array([math.nan if r["scored_at"] is None else r["scored_at"].timestamp() for r in rows], dtype=float),
        latency_ms=latency,
        score_ms=f("score_ms"),
        length=f("response_length"),
        unscored=unscored,
    )


def never_scored(row: dict[str, Any]) -> bool:
    """Whether a row's result came from no scoring at all: an error result naming no provenance (a
    record the intake refused, a trajectory ended by ``incomplete_timeout``; docs/ledger.md). Its
    ``latency_ms`` is how long it waited to be refused or expired (up to ``incomplete_timeout``),
    not a scoring latency, so it is left out of the latency figures."""
    return row["status"] != "ok" and not row.get("provenance")


def trajectory_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per trajectory of ``rows`` (one per key): its final output's, or, for a trajectory whose
    final output never arrived (ended by ``incomplete_timeout``), its highest index's; a trajectory's
    key is ``<uid>_<session_id>_<index>``."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        tid, _, index = r["key"].rpartition("_")
        r["_index"] = int(index) if index.isdigit() else -1
        seen = best.get(tid)
        if seen is None or (r["final"], r["_index"]) > (seen["final"], seen["_index"]):
            best[tid] = r
    return list(best.values())


def _pct(values: np.ndarray, q: float) -> float | None:
    v = values[~np.isnan(values)]
    return float(np.percentile(v, q)) if v.size else None


def per_source(rows: Rows) -> list[dict[str, Any]]:
    """One summary per data source, most trajectories first."""
    out = []
    for ds in sorted(set(rows.data_source.tolist())):
        m = rows.data_source == ds
        rewards = rows.reward[m & rows.ok]
        rewards = rewards[~np.isnan(rewards)]
        n, errors = int(m.sum()), int((m & ~rows.ok).sum())
        out.append(
            {
                "data_source": ds,
                "trajectories": n,
                "errors": errors,
                "error_share": errors / n if n else 0.0,
                "mean_reward": float(rewards.mean()) if rewards.size else None,
                "std_reward": float(rewards.std()) if rewards.size else None,
                "latency_p50_ms": _pct(rows.latency_ms[m], 50),
                "latency_p99_ms": _pct(rows.latency_ms[m], 99),
            }
        )
    out.sort(key=lambda s: (-s["trajectories"], s["data_source"]))
    return out


def bucket_seconds(span: float) -> int:
    """The smallest bucket width giving at most ~60 buckets over ``span`` seconds."""
    return next((b for b in _BUCKETS if span / b <= 60), _BUCKETS[-1])


def _figure() -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=_SIZE, dpi=_DPI, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode()


def _times(edges: np.ndarray) -> np.ndarray:
    """Unix seconds as UTC ``datetime64`` (what matplotlib puts on a date axis)."""
    return np.asarray(np.round(edges), dtype="int64").astype("datetime64[s]")


def _buckets(rows: Rows) -> tuple[int, float, np.ndarray]:
    """The bucket width, the first bucket's start, and each row's bucket (-1: a row without a time)."""
    t0, t1 = float(np.nanmin(rows.t)), float(np.nanmax(rows.t))
    width = bucket_seconds(t1 - t0)
    start = math.floor(t0 / width) * width
    timed = ~np.isnan(rows.t)
    return width, start, np.where(timed, (np.where(timed, rows.t, start) - start) // width, -1).astype(int)


def _time_axis(ax: Axes, start: float, width: int, count: int) -> None:
    """A UTC date axis over the buckets (one bucket of margin each side), labelled concisely."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    lo, hi = _times(np.array([start - width, start + (count + 1) * width]))
    ax.set_xlim(lo, hi)
    locator = AutoDateLocator()  # type: ignore[no-untyped-call]  # matplotlib.dates ships untyped signatures
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]  # as above
    ax.set_xlabel(f"scored at (UTC), {_width_text(width)} buckets")


def _width_text(seconds: int) -> str:
    return (
        f"{seconds // 86400} day"
        if seconds >= 86400
        else f"{seconds // 3600} h"
        if seconds >= 3600
        else f"{seconds // 60} min"
    )


def plot_reward_over_time(rows: Rows, sources: Sequence[str]) -> str:
    fig, ax = _figure()
    width, start, idx = _buckets(rows)
    for ds in sources:
        m = (rows.data_source == ds) & rows.ok & ~np.isnan(rows.reward) & (idx >= 0)
        if not m.any():
            continue
        buckets = sorted(set(idx[m].tolist()))
        means = np.array([rows.reward[m & (idx == b)].mean() for b in buckets])
        stds = np.array([rows.reward[m & (idx == b)].std() for b in buckets])
        x = _times(start + (np.array(buckets) + 0.5) * width)
        (line,) = ax.plot(x, means, marker="o", markersize=3, label=ds)
        ax.fill_between(x, means - stds, means + stds, alpha=0.15, color=line.get_color())
    ax.set_ylabel("reward (mean ± population std)")
    _time_axis(ax, start, width, int(idx.max()) + 1)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return _png(fig)


def plot_failures_over_time(rows: Rows) -> str:
    fig, ax = _figure()
    width, start, idx = _buckets(rows)
    buckets = np.arange(int(idx.max()) + 1)
    x = _times(start + buckets * width)
    bottom = np.zeros(len(buckets))
    kinds = sorted(set(rows.failure_kind[~rows.ok].tolist()))
    for kind in kinds:
        counts = np.bincount(idx[~rows.ok & (rows.failure_kind == kind) & (idx >= 0)], minlength=len(buckets)).astype(
            float
        )
        ax.bar(x, counts, width=width / 86400 * 0.9, bottom=bottom, align="edge", label=kind)
        bottom += counts
    if not kinds:
        ax.text(0.5, 0.5, "no failures", transform=ax.transAxes, ha="center", va="center")
    else:
        ax.legend(fontsize=7, title="failure_kind", title_fontsize=7)
    ax.set_ylabel("trajectories with an error result")
    _time_axis(ax, start, width, len(buckets))
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def plot_latency(rows: Rows) -> str:
    fig, ax = _figure()
    for values, label in ((rows.latency_ms, "push to result"), (rows.score_ms, "manager (run_single)")):
        v = values[~np.isnan(values) & (values > 0)]
        if v.size:
            bins = np.logspace(np.log10(v.min()), np.log10(v.max() * 1.001), 50)
            ax.hist(
                v,
                bins=bins.tolist(),
                alpha=0.55,
                label=f"{label}: p50 {np.percentile(v, 50):.1f}, p99 {np.percentile(v, 99):.1f} ms",
            )
    ax.set_xscale("log")
    ax.set_xlabel("ms (log scale)")
    ax.set_ylabel("trajectories")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _png(fig)


def plot_length_vs_reward(rows: Rows, sources: Sequence[str]) -> str:
    fig, ax = _figure()
    m_all = rows.ok & ~np.isnan(rows.reward) & ~np.isnan(rows.length)
    pick = np.flatnonzero(m_all)
    if pick.size > _MAX_POINTS:
        pick = np.random.default_rng(0).choice(pick, _MAX_POINTS, replace=False)
    chosen = np.zeros(rows.n, dtype=bool)
    chosen[pick] = True
    jitter = np.random.default_rng(1).uniform(-0.02, 0.02, rows.n)
    for ds in sources:
        m = chosen & (rows.data_source == ds)
        if m.any():
            ax.scatter(rows.length[m], rows.reward[m] + jitter[m], s=6, alpha=0.4, label=ds)
    ax.set_xlabel("final response length (tokens)")
    ax.set_ylabel("reward (jittered ±0.02)")
    ax.legend(fontsize=7, markerscale=2)
    ax.grid(alpha=0.3)
    return _png(fig)


def plot_sources(summary: list[dict[str, Any]]) -> str:
    from matplotlib.figure import Figure

    fig = Figure(figsize=_SIZE, dpi=_DPI, layout="constrained")
    slow_ax, fail_ax = fig.subplots(1, 2)
    slow = sorted((s for s in summary if s["latency_p99_ms"] is not None), key=lambda s: -s["latency_p99_ms"])[:_TOP]
    names = [s["data_source"] for s in slow][::-1]
    slow_ax.barh(names, [s["latency_p99_ms"] for s in slow][::-1], color="#c77c2c", label="p99")
    slow_ax.barh(names, [s["latency_p50_ms"] or 0 for s in slow][::-1], color="#e8b26a", label="p50")
    slow_ax.set_title("slowest data sources (latency, ms)", fontsize=9)
    slow_ax.legend(fontsize=7)
    failing = sorted(summary, key=lambda s: (-s["error_share"], -s["errors"]))[:_TOP]
    fail_ax.barh(
        [s["data_source"] for s in failing][::-1], [100 * s["error_share"] for s in failing][::-1], color="#b33"
    )
    fail_ax.set_title("most failing data sources (% of trajectories)", fontsize=9)
    for ax in (slow_ax, fail_ax):
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, axis="x")
    return _png(fig)


def _cell(value: object, fmt: str = "{:.4f}") -> str:
    if value is None:
        return '<td data-value="">-</td>'
    text = fmt.format(value) if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)
    return f'<td data-value="{html.escape(repr(value))}">{html.escape(text)}</td>'


def summary_table(summary: list[dict[str, Any]]) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "data source",
            "trajectories",
            "errors",
            "error share",
            "mean reward",
            "std reward (population)",
            "latency p50 ms",
            "latency p99 ms",
        )
    )
    body = []
    for s in summary:
        body.append(
            f'<tr data-source="{html.escape(s["data_source"])}">'
            f"<td>{html.escape(s['data_source'])}</td>"
            + _cell(s["trajectories"])
            + _cell(s["errors"])
            + _cell(s["error_share"], "{:.1%}")
            + _cell(s["mean_reward"])
            + _cell(s["std_reward"])
            + _cell(s["latency_p50_ms"], "{:.1f}")
            + _cell(s["latency_p99_ms"], "{:.1f}")
            + "</tr>"
        )
    return f'<table id="by-data-source"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


_STYLE = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1050px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 2em; }
.meta { color: #666; } img { max-width: 100%; border: 1px solid #eee; }
table { border-collapse: collapse; margin: 1em 0; } td, th { padding: 3px 10px; border-bottom: 1px solid #ddd; }
th { text-align: left; background: #f6f6f6; } td[data-value] { text-align: right; font-variant-numeric: tabular-nums; }
"""


def render(url: str, rows: Rows, title: str | None = None) -> str:
    """The report page of ``rows`` (read from ledger ``url``)."""
    summary = per_source(rows)
    sources = [s["data_source"] for s in summary][:12]
    t0, t1 = (dt.datetime.fromtimestamp(float(x), tz=dt.timezone.utc) for x in (np.nanmin(rows.t), np.nanmax(rows.t)))
    errors = int((~rows.ok).sum())
    untimed = int(np.isnan(rows.t).sum())
    untimed_note = (
        f" {untimed:,} without a result time (scored_at) are counted in the tables but on no time axis."
        if untimed
        else ""
    )
    unscored = int(rows.unscored.sum())
    if unscored:
        untimed_note += (
            f" {unscored:,} never scored (records the workers refused, trajectories ended incomplete by "
            "incomplete_timeout) are counted as errors but left out of the latency figures: their wait is "
            "no scoring latency."
        )
    images = [
        ("reward-over-time", "Reward per data source over time (mean ± one population standard deviation)",
         plot_reward_over_time(rows, sources)),
        ("failures-over-time", "Failures by kind over time", plot_failures_over_time(rows)),
        ("latency", "Scoring latency", plot_latency(rows)),
        ("length-vs-reward", "Response length against reward", plot_length_vs_reward(rows, sources)),
        ("sources", "Slowest and most failing data sources", plot_sources(summary)),
    ]  # fmt: skip
    sections = "".join(
        f'<h2>{html.escape(caption)}</h2><img id="{name}" alt="{html.escape(caption)}" '
        f'src="data:image/png;base64,{data}">'
        for name, caption, data in images
    )
    heading = html.escape(title or f"rewardq ledger report: {url}")
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{heading}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{heading}</h1>"
        f'<p class="meta" id="totals" data-trajectories="{rows.n}" data-errors="{errors}" '
        f'data-unscored="{unscored}">'
        f"{rows.n:,} trajectories ({errors:,} with errors) scored from {t0:%Y-%m-%d %H:%M} to "
        f"{t1:%Y-%m-%d %H:%M} UTC; one row per trajectory (its final output's; its last output's when its "
        f"final output never arrived), duplicates dropped.{untimed_note}</p>"
        f"<h2>Per data source</h2>{summary_table(summary)}{sections}</body></html>"
    )


def write_report(
    url: str,
    out: str,
    *,
    where: Where | None = None,
    since: str | None = None,
    until: str | None = None,
    title: str | None = None,
) -> Path:
    """Read ledger ``url`` and write its report to ``out``; returns the path."""
    try:
        import matplotlib  # noqa: F401 - the report extra
    except ImportError:
        raise ConfigError("rewardq report draws with matplotlib: pip install 'rewardq[report]'") from None
    path = Path(out)
    if not path.parent.is_dir():  # before reading the ledger and drawing: a typo costs nothing
        raise ConfigError(f"-o {out}: the folder {path.parent} does not exist; create it or give another path")
    page = render(url, load(url, where, since, until), title)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"-o {out}: the report cannot be written ({exc.strerror or exc})") from exc
    return path
