"""``rewardq top``: a live, full-screen view of one namespace, refreshed every second.

What it shows (each refresh reads only what changed in the ``done`` streams, plus one XLEN and
XINFO GROUPS per shard and the live workers' heartbeats):

* **throughput**: trajectories scored per second and errors per second over the last 10 s, each
  with a sparkline of the last minutes (``--history``, 5 by default);
* **backlog**: entries no worker has been given yet, and how long they take to drain at the fleet's
  measured rate (:func:`rewardq.queue.reads.backlog_status`), trajectories waiting for outputs,
  dead letters;
* **workers**: each live worker's rate, in-flight trajectories, counters and its last error
  (from the ``done`` streams: which trajectory, and why). A worker's name outlives its process: a
  restarted worker keeps it, and its counters start again at 0, so an error written before the
  current process started is labelled ``before restart`` (its heartbeat's ``started_at``);
* **slowest data sources** over the last minute (the workers' heartbeats: mean and longest time to
  score one trajectory);
* **reward hacks caught**: code responses that tripped a wire of the local ``assert_case`` runner,
  per data source and tripwire (the live workers' counters since they started);
* **the oldest trajectory still waiting for outputs**, and which outputs it misses;
* **trajectories waiting on a retry** after a transient failure (how many; the next one, when, and
  why) and the live workers' **error results by data source and failure kind**.

``q`` (or Ctrl-C) quits; ``--count N`` stops after N refreshes. Without a terminal (piped, or
``--once``) it prints one snapshot and exits, or N snapshots one after another with ``--count``;
``--json`` prints snapshots as JSON, one object per line. ``rewardq status --watch`` runs this
view. Read-only.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from rewardq.consumers.reward_health import judge, merge
from rewardq.ops.deadletters.stream import DeadLetters
from rewardq.ops.failures_view import failure_totals, retry_totals
from rewardq.ops.layout import fmt_duration
from rewardq.ops.status_view import health_table
from rewardq.ops.target import opened, pipeline_options
from rewardq.queue.reads import DONE_FEED_SINCE_S

if TYPE_CHECKING:
    from rewardq.queue.clients import SyncRedis
    from rewardq.queue.keys import Keyspace

__all__ = ["top", "TopModel", "render_top", "sparkline"]

#: ``rewardq top``: seconds between refreshes, minutes its sparklines cover, the slowest data
#: sources it lists, and the width it renders at when the output is no terminal.
TOP_INTERVAL = 1.0
TOP_HISTORY_MINUTES = 5.0
TOP_SLOWEST_SOURCES = 5
PIPE_WIDTH = 80


#: Seconds over which the current rates are measured.
RATE_WINDOW = 10
#: Errors looked up per refresh (one HMGET each): a burst of failures cannot slow the view down.
ERROR_LOOKUPS = 20
_BLOCKS = " ▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int) -> str:
    """``values`` (oldest first) in ``width`` characters: sums of equal bins, scaled to the largest."""
    if width <= 0 or not values:
        return ""
    per = max(1, -(-len(values) // width))
    bins = [sum(values[i : i + per]) for i in range(0, len(values), per)][-width:]
    top = max(bins)
    if top <= 0:
        return _BLOCKS[1] * len(bins)
    return "".join(_BLOCKS[max(1, round(b / top * (len(_BLOCKS) - 1)))] if b else _BLOCKS[1] for b in bins)


class TopModel:
    """What ``rewardq top`` shows, kept up to date by :meth:`refresh` (one call per screen)."""

    def __init__(self, r: SyncRedis, ks: Keyspace, url: str, history_s: float = DONE_FEED_SINCE_S) -> None:
        from rewardq.queue.reads import DoneFeed

        self.r, self.ks, self.url = r, ks, url
        self.history_s = history_s
        self.feed = DoneFeed(r, ks, since_s=history_s)
        self.buckets: dict[int, list[int]] = {}  # unix second -> [finished, errors]
        self.last_error: dict[str, dict[str, Any]] = {}  # worker -> {"time", "tid", "error"}
        self.cancelled = 0  # trajectories their producers cancelled, seen since top started

    def _take(self, finished: list[dict[str, Any]]) -> None:
        errors = []
        for d in finished:
            b = self.buckets.setdefault(int(d["time"]), [0, 0])
            b[0] += 1
            if d["status"] == "error":
                b[1] += 1
                errors.append(d)
            elif d["status"] == "cancelled":
                self.cancelled += 1
        for d in errors[-ERROR_LOOKUPS:]:
            worker, error = self.feed.error_of(d["shard"], d["tid"])
            worker = d["worker"] or worker
            if worker:
                self.last_error[worker] = {"time": d["time"], "tid": d["tid"], "error": error}
        oldest = int(time.time() - self.history_s)
        for second in [s for s in self.buckets if s < oldest]:
            del self.buckets[second]

    def series(self, now: float) -> tuple[list[int], list[int]]:
        """Trajectories finished and errors, per second of the history, oldest first."""
        end = int(now)
        seconds = range(end - int(self.history_s) + 1, end + 1)
        return [self.buckets.get(s, [0, 0])[0] for s in seconds], [self.buckets.get(s, [0, 0])[1] for s in seconds]

    def refresh(self) -> dict[str, Any]:
        """One snapshot (JSON-able; what ``--json`` prints)."""
        from rewardq.ops.overview import ledger_totals
        from rewardq.queue.reads import backlog_status, shard_status, waiting_status, workers_status
        from rewardq.reward.judge.cache import judge_totals

        self._take(self.feed.poll())
        now = time.time()
        done, errs = self.series(now)
        workers = workers_status(self.r, self.ks, now)
        shards = [shard_status(self.r, self.ks, s) for s in range(self.ks.shards)]
        waiting = [w for w in waiting_status(self.r, self.ks, limit=5, now=now) if w["missing"] or w["final"] is None]
        # the last RATE_WINDOW whole seconds (the current one is still filling)
        window = slice(-RATE_WINDOW - 1, -1)
        return {
            "namespace": self.ks.namespace,
            "redis_url": self.url,
            "time": now,
            "trajectories_per_s": round(sum(done[window]) / RATE_WINDOW, 2),
            "errors_per_s": round(sum(errs[window]) / RATE_WINDOW, 2),
            "history_s": self.history_s,
            "scored_per_second": done,
            "errors_per_second": errs,
            "backlog": backlog_status(shards, workers),
            "waiting_total": sum(int(self.r.zcard(self.ks.waiting(s))) for s in range(self.ks.shards)),
            "dead_letters": DeadLetters(self.r, self.ks).count(),
            "workers": [
                {
                    **{k: w[k] for k in ("name", "host", "pid", "rate_per_s", "outputs_per_s", "in_flight")},
                    **{k: w[k] for k in ("scored", "errors", "idle_s")},
                    "last_error": _this_life(self.last_error.get(w["name"]), w["started_at"]),
                }
                for w in workers
            ],
            "sources": slowest_sources(workers),
            "hacks": hacks_caught(workers),
            "reward_health": judge(merge(w.get("health") or {} for w in workers)),
            "oldest_waiting": waiting[0] if waiting else None,
            "retrying": retry_totals(workers, listed=3),
            "failures": failure_totals(workers),
            "cancelled": self.cancelled,
            "judges": judge_totals(self.r, self.ks),
            "ledger": ledger_totals(workers),
        }


def _this_life(last: dict[str, Any] | None, started_at: float) -> dict[str, Any] | None:
    """A worker's last error, with ``previous_life`` true when it was written before the worker's
    current process started (``started_at``, from its heartbeat). The error's time is Redis's (its
    ``done`` entry's id) and ``started_at`` the worker host's clock, so a clock off by a second
    labels only errors within a second of a restart wrongly."""
    return None if last is None else {**last, "previous_life": last["time"] < started_at}


def slowest_sources(workers: list[dict[str, Any]], limit: int = TOP_SLOWEST_SOURCES) -> list[dict[str, Any]]:
    """The data sources that took longest to score over the last minute, over every live worker."""
    acc: dict[str, dict[str, float]] = {}
    for w in workers:
        for ds, st in (w.get("sources") or {}).items():
            if not isinstance(st, dict):
                continue
            a = acc.setdefault(ds, {"n": 0, "total_s": 0.0, "max_s": 0.0})
            n = float(st.get("n", 0))
            a["n"] += n
            a["total_s"] += n * float(st.get("mean_s", 0.0))
            a["max_s"] = max(a["max_s"], float(st.get("max_s", 0.0)))
    rows: list[dict[str, Any]] = [
        {"data_source": ds, "trajectories": int(a["n"]), "mean_s": round(a["total_s"] / a["n"], 4), "max_s": a["max_s"]}
        for ds, a in acc.items()
        if a["n"]
    ]
    rows.sort(key=lambda r: -r["mean_s"])
    return rows[:limit]


def hacks_caught(workers: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """``{data_source: {tripwire: responses}}`` over every live worker (only those with any)."""
    from rewardq.ops.overview import code_totals

    return {ds: dict(c["tripwires"]) for ds, c in code_totals(workers).items() if c["tripwires"]}


def clip(text: str, chars: int) -> str:
    """``text`` on one line, cut at a word boundary to at most ``chars`` characters (with ``…``)."""
    line = " ".join(text.split())
    if len(line) <= chars:
        return line
    cut = line[: chars - 1].rsplit(" ", 1)[0]
    return (cut if len(cut) > chars // 2 else line[: chars - 1]) + "…"


def _secs(v: float | None) -> str:
    return "never (nothing is scored)" if v is None else fmt_duration(v)


def render_top(snap: dict[str, Any], width: int = PIPE_WIDTH) -> Any:
    """One snapshot as a rich renderable that fits ``width`` columns."""
    from rich import box
    from rich.console import Console, Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    head = Text.assemble(
        ("rewardq top ", "bold"),
        (snap["namespace"], "bold cyan"),
        f" on {snap['redis_url']}  {time.strftime('%H:%M:%S', time.localtime(snap['time']))}",
        ("   q quits", "dim"),
    )
    parts.append(head)
    spark_w = max(10, width - 36)
    minutes = f"{snap['history_s'] / 60:g} min"
    rates = Table(show_header=False, box=None, padding=(0, 1))
    rates.add_column(style="bold", no_wrap=True)
    rates.add_column(justify="right", no_wrap=True)
    rates.add_column(no_wrap=True)
    rates.add_row(
        "scored/s", f"{snap['trajectories_per_s']:g}", Text(sparkline(snap["scored_per_second"], spark_w), "green")
    )
    rates.add_row("errors/s", f"{snap['errors_per_s']:g}", Text(sparkline(snap["errors_per_second"], spark_w), "red"))
    parts.append(rates)
    parts.append(Text(f"sparklines: the last {minutes}; rates: the last {RATE_WINDOW}s", style="dim"))
    b = snap["backlog"]
    facts = Table(show_header=False, box=None, padding=(0, 1))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column()
    drain = b["seconds"]
    facts.add_row(
        "backlog",
        Text.assemble(
            f"{b['entries']:,} entries" + ("" if b["exact"] else " (estimated)") + ", drains in ",
            (_secs(drain), "yellow" if drain is None or drain > 60 else "green"),
            f" at {b['outputs_per_s']:g} outputs/s",
        ),
    )
    facts.add_row(
        "waiting",
        Text.assemble(
            f"{snap['waiting_total']} trajector{'y' if snap['waiting_total'] == 1 else 'ies'} waiting for outputs; ",
            (
                f"{snap['dead_letters']} dead letter{'' if snap['dead_letters'] == 1 else 's'}",
                "red" if snap["dead_letters"] else "",
            ),
        ),
    )
    retrying = snap["retrying"]
    if retrying["n"]:
        nxt = retrying["waiting"][0] if retrying["waiting"] else None
        facts.add_row(
            "retrying",
            Text.assemble(
                (f"{retrying['n']} waiting on a retry", "yellow"),
                ""
                if nxt is None
                else f"; next {nxt.get('tid')} in {fmt_duration(nxt.get('next_in_s'))} "
                f"(try {int(nxt.get('retries', 0)) + 1}, gives up in {fmt_duration(nxt.get('left_s'))}): "
                + clip(str(nxt.get("reason", "")), max(40, width - 60)),
            ),
        )
    failed = {ds: {k: n for k, n in kinds.items() if n} for ds, kinds in snap["failures"].items()}
    failed = {ds: kinds for ds, kinds in failed.items() if kinds}
    if failed:
        facts.add_row(
            "failures",
            Text(
                clip(
                    "; ".join(
                        f"{ds}: " + ", ".join(f"{k} {n}" for k, n in kinds.items()) for ds, kinds in failed.items()
                    ),
                    max(40, (width - 12) * 2),
                ),
                "red",
            ),
        )
    if snap.get("ledger"):
        from rewardq.ops.status_view import ledger_line

        facts.add_row("ledger", ledger_line(snap["ledger"]))
    if snap.get("cancelled"):
        facts.add_row("cancelled", f"{snap['cancelled']:,} trajectories cancelled by their producers (never scored)")
    for model, j in (snap.get("judges") or {}).items():
        shared = f" ({j['shared_hits']:,} shared)" if j.get("shared_hits") else ""
        facts.add_row(
            "judge",
            Text(
                clip(
                    f"{model}: {j.get('requests', 0):,} requests, {j.get('cache_hits', 0):,} cache hits{shared}, "
                    f"{j.get('saved_tokens', 0):,} tokens saved"
                    + (f", {j['aborted']:,} aborted" if j.get("aborted") else ""),
                    max(40, (width - 12) * 2),
                )
            ),
        )
    parts.append(facts)

    clip_at = max(40, (width - 45) * 2)  # about two lines of the "last error" column
    workers = Table(
        title=f"workers ({len(snap['workers'])})", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1)
    )
    workers.add_column("worker", overflow="fold", ratio=2)
    workers.add_column("pid", justify="right", no_wrap=True)
    workers.add_column("scored/s", justify="right", no_wrap=True)
    workers.add_column("in flight", justify="right", no_wrap=True)
    workers.add_column("errors", justify="right", no_wrap=True)
    workers.add_column("last error", overflow="fold", ratio=3)
    for w in snap["workers"]:
        last = w.get("last_error")
        workers.add_row(
            escape(w["name"]),
            str(w["pid"]),
            f"{w['rate_per_s']:g}",
            str(w["in_flight"]),
            f"[red]{w['errors']}[/]" if w["errors"] else "0",
            "-"
            if not last
            else escape(
                clip(
                    ("before restart, " if last.get("previous_life") else "")
                    + f"{fmt_duration(snap['time'] - last['time'])} ago {last['tid']}: {last['error']}",
                    clip_at,
                )
            ),
        )
    if not snap["workers"]:
        workers.add_row("[red]none alive[/]", "", "", "", "", "")
    parts.append(workers)

    sources = Table(title="slowest data sources (last 60s)", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    sources.add_column("data source", overflow="fold", ratio=1)
    for col in ("trajectories", "mean", "longest"):
        sources.add_column(col, justify="right", no_wrap=True)
    for s in snap["sources"]:
        sources.add_row(escape(s["data_source"]), str(s["trajectories"]), f"{s['mean_s']:.3f}s", f"{s['max_s']:.3f}s")
    if not snap["sources"]:
        sources.add_row("-", "", "", "")
    parts.append(sources)

    w = snap["oldest_waiting"]
    if w:
        misses = f"outputs {','.join(map(str, w['missing']))}" if w["missing"] else "its final output"
        parts.append(
            Text.assemble(
                ("oldest waiting ", "bold"),
                (w["tid"], "yellow"),
                f": waited {fmt_duration(w['waited_s'])} for {misses}; given up in {fmt_duration(w['expires_in_s'])}",
            )
        )
    else:
        parts.append(Text.assemble(("oldest waiting ", "bold"), ("none: every trajectory has its outputs", "green")))
    hacks = snap.get("hacks") or {}
    if hacks:
        caught = Table(
            title="reward hacks caught (tripwires)", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1)
        )
        caught.add_column("data source", overflow="fold", ratio=1)
        caught.add_column("responses", justify="right", no_wrap=True)
        caught.add_column("tripwires", overflow="fold", ratio=2)
        for ds, wires in sorted(hacks.items()):
            shown = ", ".join(f"{k}: {n}" for k, n in sorted(wires.items()))
            caught.add_row(escape(ds), f"[red]{sum(wires.values())}[/]", escape(shown))
        parts.append(caught)  # only when there are: a short terminal keeps the lines above
    if snap.get("reward_health"):  # last: a short terminal keeps the lines above
        parts.append(health_table(snap["reward_health"], Console(width=width, highlight=False), wide=False))
    return Group(*parts)


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """Single key presses from the terminal (cbreak mode, restored on exit); a no-op without one."""
    if not sys.stdin.isatty():
        yield lambda timeout: time.sleep(timeout)
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def read(timeout: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 1).decode(errors="replace") if ready else None

    try:
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@click.command()
@pipeline_options
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=TOP_INTERVAL,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--history",
    type=click.FloatRange(min=1),
    default=TOP_HISTORY_MINUTES,
    show_default=True,
    help="Minutes the sparklines cover.",
)
@click.option("--once", is_flag=True, help="Print one snapshot and exit (what a pipe gets anyway).")
@click.option("--json", "as_json", is_flag=True, help="Print one snapshot as JSON and exit (--count: one per line).")
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many refreshes (piped or with --json: print that many snapshots).",
)
def top(
    redis_url: str,
    namespace: str,
    cluster: bool,
    group: str,
    interval: float,
    history: float,
    once: bool,
    as_json: bool,
    count: int | None,
) -> int:
    """Live view of one namespace: rates with sparklines, backlog and drain time, workers, slow sources.

    q quits. Piped (no terminal), it prints one snapshot (or --count snapshots) and exits. Exit
    code 0; 1 when the namespace does not exist; 3 when Redis is unreachable.
    """
    from rich.console import Console
    from rich.live import Live

    console = Console(highlight=False)
    with opened(redis_url, namespace, cluster=cluster, group=group) as p:
        model = TopModel(p.client, p.ks, p.url, history_s=history * 60)
        if as_json or once or not console.is_terminal:
            return _snapshots(console, model, 1 if once else count or 1, interval, as_json)
        try:
            with _keys() as read, Live(console=console, screen=True, auto_refresh=False) as live:
                for _ in itertools.count() if count is None else range(count):
                    live.update(render_top(model.refresh(), console.width), refresh=True)
                    deadline = time.monotonic() + interval
                    while (left := deadline - time.monotonic()) > 0:
                        if (read(left) or "").lower() == "q":
                            return 0
        except KeyboardInterrupt:  # Ctrl-C is a way to quit too
            return 0
        return 0


def _snapshots(console: Any, model: TopModel, count: int, interval: float, as_json: bool) -> int:
    """``count`` snapshots one after another, ``interval`` seconds apart (JSON lines, or the screen
    with a rule between two); Ctrl-C ends them early."""
    try:
        for i in range(count):
            if i:
                time.sleep(interval)
                if not as_json:
                    console.rule()
            snap = model.refresh()
            if as_json:
                click.echo(json.dumps(snap))
            else:
                console.print(render_top(snap, console.width))
    except KeyboardInterrupt:
        pass
    return 0
