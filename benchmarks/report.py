"""The result table, the ratios measured in the same run, and PASS/MISS against the performance targets
(0.5x the raw loop's outputs/s, 5x the fastest peer, p99 <= 3 ms and below every peer).

Ratios: on a throughput row, "vs raw" is its outputs/s over the raw baseline's and
"vs best peer" its trajectories/s over the fastest peer's (every system drains the same
workload, so both units give the same ratio). On a latency row both ratios compare p99
(lower is better there).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

from rich.console import Console, JustifyMethod
from rich.table import Table

from benchmarks.common import Row, finite

PEERS = ("celery", "rq", "arq", "dramatiq")


@dataclass
class Target:
    name: str
    goal: str
    measured: str
    verdict: str  # PASS | MISS | n/a


def _find(rows: list[Row], system: str, phase: str, workers: int = 1) -> Row | None:
    for r in rows:
        if r.system == system and r.phase == phase and r.workers == workers and r.status in ("ok", "partial"):
            return r
    return None


def best_peer(rows: list[Row], phase: str) -> Row | None:
    """The fastest peer (throughput: highest traj/s; latency: lowest p99)."""
    cands = [r for r in rows if r.system in PEERS and r.phase == phase and r.status in ("ok", "partial")]
    if phase == "throughput":
        cands = [r for r in cands if finite(r.traj_per_s)]
        return max(cands, key=lambda r: r.traj_per_s or 0.0) if cands else None
    cands = [r for r in cands if finite(r.p99_ms)]
    return min(cands, key=lambda r: r.p99_ms or 0.0) if cands else None


def ratios(rows: list[Row]) -> None:
    """Fill ``extra["vs_raw"]`` and ``extra["vs_peer"]`` of throughput and latency rows."""
    raw_t, raw_l = _find(rows, "raw", "throughput"), _find(rows, "raw", "latency")
    peer_t, peer_l = best_peer(rows, "throughput"), best_peer(rows, "latency")
    for r in rows:
        if r.phase == "throughput" and finite(r.outputs_per_s):
            if raw_t and finite(raw_t.outputs_per_s):
                r.extra["vs_raw"] = r.outputs_per_s / raw_t.outputs_per_s
            if peer_t and finite(r.traj_per_s) and finite(peer_t.traj_per_s):
                r.extra["vs_peer"] = r.traj_per_s / peer_t.traj_per_s
        if r.phase == "latency" and finite(r.p99_ms):
            if raw_l and finite(raw_l.p99_ms):
                r.extra["vs_raw"] = r.p99_ms / raw_l.p99_ms
            if peer_l and finite(peer_l.p99_ms):
                r.extra["vs_peer"] = r.p99_ms / peer_l.p99_ms


#: Issue 31's goals for ``python -m benchmarks``: one worker's outputs/s against the raw loop's, and
#: two workers' against one's (GSM8K scoring, a backlog already in Redis).
RAW_RATIO_GOAL = 0.7
TWO_WORKERS_GOAL = 1.8


def targets(rows: list[Row]) -> list[Target]:
    out: list[Target] = []
    rq1, rq2 = _find(rows, "rewardq", "throughput", 1), _find(rows, "rewardq", "throughput", 2)
    raw = _find(rows, "raw", "throughput")
    peer = best_peer(rows, "throughput")
    if rq1 and raw and finite(rq1.outputs_per_s) and finite(raw.outputs_per_s):
        x = rq1.outputs_per_s / raw.outputs_per_s
        out.append(
            Target(
                "throughput vs raw baseline (1 worker)",
                f">= {RAW_RATIO_GOAL:.2f}x",
                f"{x:.2f}x ({rq1.outputs_per_s:,.0f} vs {raw.outputs_per_s:,.0f} outputs/s)",
                "PASS" if x >= RAW_RATIO_GOAL else "MISS",
            )
        )
    else:
        out.append(Target("throughput vs raw baseline (1 worker)", f">= {RAW_RATIO_GOAL:.2f}x", "not measured", "n/a"))
    if rq1 and peer and finite(rq1.traj_per_s) and finite(peer.traj_per_s):
        x = rq1.traj_per_s / peer.traj_per_s
        out.append(
            Target(
                "throughput vs fastest peer (1 worker)",
                ">= 5x",
                f"{x:.2f}x ({rq1.traj_per_s:,.0f} vs {peer.system} {peer.traj_per_s:,.0f} traj/s)",
                "PASS" if x >= 5 else "MISS",
            )
        )
    else:
        out.append(
            Target(
                "throughput vs fastest peer (1 worker)",
                ">= 5x",
                "no peer measured" if rq1 else "rewardq not measured",
                "n/a",
            )
        )
    lat = _find(rows, "rewardq", "latency")
    if lat and finite(lat.p99_ms):
        out.append(
            Target(
                "p99 latency, final put -> reward readable",
                "<= 3 ms",
                f"{lat.p99_ms:.2f} ms",
                "PASS" if lat.p99_ms <= 3.0 else "MISS",
            )
        )
        pl = best_peer(rows, "latency")
        if pl and finite(pl.p99_ms):
            out.append(
                Target(
                    "p99 latency below every peer",
                    f"< {pl.system} {pl.p99_ms:.2f} ms",
                    f"{lat.p99_ms:.2f} ms",
                    "PASS" if lat.p99_ms < pl.p99_ms else "MISS",
                )
            )
        else:
            out.append(Target("p99 latency below every peer", "< every peer", "no peer measured", "n/a"))
    else:
        out.append(Target("p99 latency, final put -> reward readable", "<= 3 ms", "not measured", "n/a"))
    mem = sorted(
        (r for r in rows if r.phase == "memory" and finite(r.rss_mb) and r.backlog), key=lambda r: r.backlog or 0
    )
    if len(mem) >= 2:
        small, big = mem[0], mem[-1]
        assert small.rss_mb is not None and big.rss_mb is not None  # the rows were chosen for it
        x = big.rss_mb / small.rss_mb
        out.append(
            Target(
                "worker peak RSS independent of backlog",
                "big/small <= 1.15",
                f"{small.rss_mb:.0f} MB @ {small.backlog:,} vs {big.rss_mb:.0f} MB @ {big.backlog:,} ({x:.2f}x)",
                "PASS" if x <= 1.15 else "MISS",
            )
        )
    else:
        out.append(Target("worker peak RSS independent of backlog", "big/small <= 1.15", "not measured", "n/a"))
    img = next((r for r in rows if r.phase == "memory+images" and finite(r.rss_mb)), None)
    plain = next((r for r in mem if img is not None and r.backlog == img.backlog), None)
    if img is not None and plain is not None:
        kb, kb0 = img.extra.get("redis_kb_per_trajectory"), plain.extra.get("redis_kb_per_trajectory")
        cpu = f", worker CPU {img.cpu_ms:.2f} vs {plain.cpu_ms:.2f} ms/traj" if img.cpu_ms and plain.cpu_ms else ""
        out.append(
            Target(
                "a waiting trajectory with images (information)",
                "-",
                f"Redis {_f(kb)} KB vs {_f(kb0)} KB without; worker peak RSS {img.rss_mb:.0f} vs "
                f"{plain.rss_mb:.0f} MB{cpu} (text-only scorer)",
                "n/a",
            )
        )
    out += ledger_targets(rows)
    if rq1 and rq2 and finite(rq1.traj_per_s) and finite(rq2.traj_per_s):
        x = rq2.traj_per_s / rq1.traj_per_s
        out.append(
            Target(
                "two workers vs one",
                f">= {TWO_WORKERS_GOAL:.1f}x",
                f"{x:.2f}x on this {_cores()}-core machine{_two_worker_ceiling(rq1, rq2)}",
                "PASS" if x >= TWO_WORKERS_GOAL else "MISS",
            )
        )
    return out


def _two_worker_ceiling(rq1: Row, rq2: Row) -> str:
    """What this machine's cores allow two workers against one (docs/performance.md, "What two cores
    allow for 2 workers against 1"): ``k`` single-threaded workers drain at most ``k/w`` trajectories
    a second (``w``: worker CPU per trajectory), and all of them with Redis at most ``cores/(w + r)``
    (``r``: Redis's). First with one worker's ``w`` and ``r`` for both drains, then with each drain's
    own: two workers sharing the cores with Redis spend more CPU per trajectory than one does."""
    cores = _cores()
    w1, r1, w2, r2 = rq1.cpu_ms, rq1.redis_cpu_ms, rq2.cpu_ms, rq2.redis_cpu_ms
    if not (w1 and r1 and finite(w1) and finite(r1)) or cores < 1:
        return ""

    def most(k: int, w: float, r: float) -> float:
        return min(k / w, cores / (w + r))

    one = most(1, w1, r1)
    out = (
        f" (at most {most(2, w1, r1) / one:.2f}x with {w1:.2f} ms of worker and {r1:.2f} ms of Redis CPU per trajectory"
    )
    if w2 and r2 and finite(w2) and finite(r2):
        out += f"; {most(2, w2, r2) / one:.2f}x with the {w2:.2f} and {r2:.2f} ms the two workers' drain spent"
    return out + ")"


def ledger_targets(rows: list[Row]) -> list[Target]:
    """The ledger's cost (``--only ledger``): CPU per trajectory with it over without (goal: at most
    +10 %; medians of the drains; the worker process alone, and its whole process tree: flusher
    process, scorer processes, exited children), and its latency p99 against the spread of the
    plain runs around it."""
    out: list[Target] = []

    def pick(system: str, phase: str, field: str) -> list[float]:
        values = [getattr(r, field, None) if hasattr(r, field) else r.extra.get(field) for r in rows]
        return [
            float(v)
            for r, v in zip(rows, values)
            if r.system == system and r.phase == phase and r.status == "ok" and finite(v)
        ]

    tree = "the worker's process tree (worker + flusher + scorer processes)"
    for label, field in (("the worker process", "worker_cpu_ms"), (tree, "cpu_ms")):
        off, on = pick("rewardq", "ledger A/B", field), pick("rewardq+ledger", "ledger A/B", field)
        if off and on:
            x = median(on) / median(off) - 1
            paired = ", ".join(f"{r:+.0%}" for r in _round_ratios(rows, field))
            out.append(
                Target(
                    f"ledger: CPU per trajectory (GSM8K), {label}",
                    "<= +10 %",
                    f"{x:+.1%} (medians {median(on):.2f} vs {median(off):.2f} ms/traj, {len(on)} drains each; "
                    f"each round's on over off: {paired})",
                    "PASS" if x <= 0.10 else "MISS",
                )
            )
    p_off, p_on = (
        pick("rewardq", "ledger A/B latency", "p99_ms"),
        pick("rewardq+ledger", "ledger A/B latency", "p99_ms"),
    )
    if p_off and p_on:
        band = max(p_off)
        out.append(
            Target(
                "ledger: latency p99 within the plain runs' noise",
                f"<= {band * 1.1:.2f} ms (plain {', '.join(f'{p:.2f}' for p in p_off)} ms, +10 %)",
                f"{p_on[0]:.2f} ms",
                "PASS" if p_on[0] <= band * 1.1 else "MISS",
            )
        )
    return out


def _round_ratios(rows: list[Row], field: str) -> list[float]:
    """Per round of ledger drains (off/on/on/off, their notes start ``round N``): the mean of its
    runs with the ledger over the mean of those without, minus 1; the spread of these is the noise."""
    rounds: dict[str, tuple[list[float], list[float]]] = {}
    for r in rows:
        v = getattr(r, field, None) if hasattr(r, field) else r.extra.get(field)
        if r.phase != "ledger A/B" or r.status != "ok" or not finite(v):
            continue
        off, on = rounds.setdefault(r.note.split(";")[0], ([], []))
        (on if r.system == "rewardq+ledger" else off).append(float(v))
    return [sum(on) / len(on) / (sum(off) / len(off)) - 1 for off, on in rounds.values() if off and on]


def _cores() -> int:
    import os

    return os.cpu_count() or 0


def _f(x: Any, fmt: str = "{:,.0f}") -> str:
    return fmt.format(x) if finite(x) else "-"


def render(rows: list[Row], tgts: list[Target], console: Console | None = None, title: str = "") -> None:
    console = console or Console(width=220)
    t = Table(title=title or "rewardq benchmark (all numbers measured in this run)", show_lines=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("system", "left"),
        ("phase", "left"),
        ("workers", "right"),
        ("backlog", "right"),
        ("traj", "right"),
        ("outputs", "right"),
        ("time s", "right"),
        ("outputs/s", "right"),
        ("traj/s", "right"),
        ("vs raw", "right"),
        ("vs best peer", "right"),
        ("p50 ms", "right"),
        ("p99 ms", "right"),
        ("max ms", "right"),
        ("peak RSS MB", "right"),
        ("CPU ms/traj", "right"),
        ("redis CPU ms/traj", "right"),
        ("check", "left"),
        ("status", "left"),
        ("notes", "left"),
    )
    for col, just in columns:
        t.add_column(col, justify=just, overflow="fold")
    for r in rows:
        t.add_row(
            r.system,
            r.phase,
            str(r.workers),
            _f(r.backlog),
            _f(r.trajectories),
            _f(r.outputs),
            _f(r.seconds, "{:.2f}"),
            _f(r.outputs_per_s),
            _f(r.traj_per_s),
            _f(r.extra.get("vs_raw"), "{:.2f}x"),
            _f(r.extra.get("vs_peer"), "{:.2f}x"),
            _f(r.p50_ms, "{:.2f}"),
            _f(r.p99_ms, "{:.2f}"),
            _f(r.max_ms, "{:.2f}"),
            _f(r.rss_mb),
            _f(r.cpu_ms, "{:.2f}"),
            _f(r.redis_cpu_ms, "{:.2f}"),
            r.check,
            r.status,
            r.note,
        )
    console.print(t)
    tt = Table(title="targets")
    for col in ("target", "goal", "measured", "result"):
        tt.add_column(col, overflow="fold")
    for g in tgts:
        style = {"PASS": "green", "MISS": "red"}.get(g.verdict, "")
        tt.add_row(g.name, g.goal, g.measured, f"[{style}]{g.verdict}[/]" if style else g.verdict)
    console.print(tt)
