"""The cost of the reward ledger and of provenance, measured against rewardq without them in one run.

``python -m benchmarks --only ledger`` (also part of a full run):

* **CPU per trajectory**: the same backlog drained by one worker without and with ``--ledger``
  (GSM8K scoring, alternating off/on so drift hits both), CPU of the worker process (every thread:
  the flusher's Parquet writing included) from the start of the drain until the ledger holds
  every row. The ledger flushes every second here (the default is 60 s): its per-file costs are
  paid ~60 times more often than in production, so the figure is an upper bound.
* **Latency**: p99 from the final put to the reward, without, with, and again without the ledger
  (the two plain runs show the noise the ledger's run is compared with).
* **Provenance**, in-process: the provenance book's lookup per trajectory, and what the three
  provenance fields add to encoding one trajectory's results.
"""

from __future__ import annotations

import shutil
import time
import timeit
from pathlib import Path

from benchmarks.common import Cleanup, Row, Settings, connect, watch_drain
from benchmarks.rewardq_bench import done_count, fill, start_workers
from benchmarks.workload import Workload

#: Seconds the ledger collects before a flush in these runs (the default is 60).
FLUSH = 1.0
#: Seconds waited after every drain (with or without the ledger), for its last flush.
SETTLE = 2.5


def _ledger_rows(folder: Path) -> int:
    import pyarrow.dataset as pads

    if not any(folder.rglob("*.parquet")):
        return 0
    return int(pads.dataset(str(folder), format="parquet", ignore_prefixes=["_", "."]).count_rows())


def drain(s: Settings, cleanup: Cleanup, ledger: Path | None, rnd: int) -> Row:
    """One drain of ``s.trajectories`` by one worker, with the ledger at ``ledger`` or without."""
    on = ledger is not None
    ns = s.prefix(f"ledger-{'on' if on else 'off'}-{rnd}")
    cleanup.add(f"{ns}:*")
    nt, no = fill(s.redis_url, ns, Workload(s.seed, tag=f"lg{rnd}-").range(0, s.trajectories))
    extra = ["--ledger", str(ledger), "--ledger-flush-interval", str(FLUSH)] if ledger is not None else []
    [child] = start_workers(s, ns, 1, f"{s.run_id}-lg{rnd}{'on' if on else 'off'}", extra)
    r = connect(s.redis_url)
    try:
        cpu0 = child.cpu_seconds()
        child.go()
        d = watch_drain(lambda: done_count(r, ns), nt, s.drain_timeout, alive=child.alive)
        time.sleep(SETTLE)
        rows = 0
        if ledger is not None:
            deadline = time.monotonic() + 30
            while (rows := _ledger_rows(ledger)) < no and time.monotonic() < deadline:
                time.sleep(0.2)
        cpu = child.cpu_seconds() - cpu0
        row = Row(
            "rewardq+ledger" if on else "rewardq",
            "ledger A/B",
            outputs=no,
            rss_mb=child.peak_rss_mb(),
            note=f"round {rnd}; CPU from the drain's start until the ledger held every row (+{SETTLE:g}s idle)"
            + (f"; {rows:,} ledger rows, flushed every {FLUSH:g}s" if on else ""),
            **d.row_fields(nt, no),
        )
        row.cpu_ms = 1000.0 * cpu / max(1, d.last_count)
        if on and rows < no:
            row.status = f"partial: the ledger holds {rows} of {no} rows"
        return row
    finally:
        child.stop()
        r.close()
        cleanup.run([f"{ns}:*"])


def latency(s: Settings, cleanup: Cleanup, ledger: Path | None, rnd: int) -> Row:
    from benchmarks import latency as lat

    on = ledger is not None
    ns = s.prefix(f"ledger-lat-{'on' if on else 'off'}-{rnd}")
    cleanup.add(f"{ns}:*")
    extra = ["--ledger", str(ledger), "--ledger-flush-interval", str(FLUSH)] if ledger is not None else []
    [child] = start_workers(s, ns, 1, f"{s.run_id}-lglat{rnd}", extra)
    try:
        child.go()
        row = lat.rewardq_latency(s, ns, child, system="rewardq+ledger" if on else "rewardq")
        row.phase = "ledger A/B latency"
        row.note = f"round {rnd}; {row.note}"
        return row
    finally:
        child.stop()
        cleanup.run([f"{ns}:*"])


def provenance_row() -> Row:
    """The provenance book's lookup and the three result fields, per trajectory, in-process."""
    from rewardq.queue.results import RewardResult, encode_results
    from rewardq.reward.managers.naive import NaiveRewardManager
    from rewardq.reward.provenance import ProvenanceBook
    from rewardq.reward.tokenizer import load_tokenizer

    book = ProvenanceBook(
        NaiveRewardManager(load_tokenizer("builtin:demo")),
        manager_spec="naive",
        scoring="0" * 16,
        reward_fn=None,
        custom=False,
        version="x",
    )
    sources = ["openai/gsm8k", "lighteval/MATH", "math_dapo", "searchR1_nq"]
    book.of(sources[0])
    n = 200_000
    lookup_us = 1e6 * min(timeit.repeat(lambda: book.of(sources[0]), number=n, repeat=3)) / n
    extra = {"acc": 1.0, "pred": "72"}

    def results(prov: str, attempt: int) -> list[RewardResult]:
        return [
            RewardResult(f"u_s_{i}", "ok", 1.0, extra, worker="w", manager="naive", scored_at=1.0, latency_ms=2.0,
                         provenance=prov, attempt=attempt)
            for i in range(5)
        ]  # fmt: skip

    with_prov, without = results("0123456789abcdef", 1), results("", 0)
    m = 20_000
    t_with = min(timeit.repeat(lambda: encode_results(with_prov, 1 << 20), number=m, repeat=3)) / m
    t_without = min(timeit.repeat(lambda: encode_results(without, 1 << 20), number=m, repeat=3)) / m
    # every result hash holds the three fields' names (empty values too); a worker fills their values
    size = encode_results(with_prov, 1 << 20).sizes[0] - encode_results(without, 1 << 20).sizes[0]
    size += sum(len(f) for f in ("provenance", "attempt", "judge_request"))
    return Row(
        "provenance",
        "micro",
        note=f"book lookup {lookup_us * 1000:.0f} ns/trajectory; encoding 5 keys' results {t_without * 1e6:.2f} -> "
        f"{t_with * 1e6:.2f} us (+{(t_with - t_without) * 1e6:.2f} us); +{size} bytes per key in Redis",
    )


def run(s: Settings, cleanup: Cleanup) -> list[Row]:
    """Alternating off/on drains (one round with --quick, two otherwise), latency off/on/off, provenance."""
    rows: list[Row] = [provenance_row()]
    folder = s.workdir / "ledger"
    rounds = 1 if s.quick else 2
    if "throughput" in s.phases:
        for rnd in range(1, rounds + 1):
            rows.append(drain(s, cleanup, None, rnd))
            shutil.rmtree(folder, ignore_errors=True)
            rows.append(drain(s, cleanup, folder, rnd))
            shutil.rmtree(folder, ignore_errors=True)
    if "latency" in s.phases:
        rows.append(latency(s, cleanup, None, 1))
        rows.append(latency(s, cleanup, folder, 1))
        shutil.rmtree(folder, ignore_errors=True)
        rows.append(latency(s, cleanup, None, 2))
    return rows
