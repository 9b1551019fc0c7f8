"""The cost of the reward ledger and of provenance, measured against rewardq without them in one run.

``python -m benchmarks --only ledger`` (also part of a full run):

* **CPU per trajectory**: the same backlog drained by one worker without and with ``--ledger``
  (GSM8K scoring; each round off/on/on/off, so a drift of the machine's load hits both alike;
  three rounds, one with ``--quick``), CPU over the same window in both: from the start of the
  drain until ``FLUSH + SETTLE`` seconds after its end, by which the ledger holds every row (the
  run says so when it does not). A row's ``cpu_ms`` is the worker's whole process tree: the worker
  process (every thread: GSM8K scores inline in it), its ledger flusher process, any scorer process
  it runs, and the children that exited and that it reaped (their CPU stays in its ``cutime``);
  it is what the ratio's goal is checked on with and without the ledger. ``extra`` splits it into
  the worker process alone (``worker_cpu_ms``: the scoring loop and the spool writes;
  ``worker_sys_ms`` its kernel part), the flusher process (``flusher_cpu_ms``: Parquet) and the
  other children (``children_cpu_ms``). The Redis server's CPU is in neither (the ledger adds no
  Redis command per trajectory). The ledger writes a file every ``FLUSH`` seconds here: at these
  drain rates a file holds about as many trajectories as the default 128 MB cut
  (``ledger_file_bytes``) makes it hold (``--quick``: every ``QUICK_FLUSH`` seconds). The drain
  starts once the flusher process has started (its start, ~0.5 s of CPU once per worker, is
  ``extra["flusher_start_cpu_s"]``, not in ``cpu_ms``).
* **Latency**: p99 from the final put to the reward, without, with, and again without the ledger
  (the two plain runs show the noise the ledger's run is compared with); with the ledger, from
  once its flusher process has started, as in the drains.
* **Where it goes**, in-process (:mod:`benchmarks.ledger_micro`): the worker's spool write and
  each step of the flusher, per trajectory, without other processes competing.
* **The flusher process alone** (:mod:`benchmarks.ledger_flusher`): its CPU and peak resident
  set writing two segments of the workload, beyond what it costs idle.
* **Provenance**, in-process: the provenance book's lookup per trajectory, and what the three
  provenance fields add to encoding one trajectory's results.
"""

from __future__ import annotations

import os
import shutil
import time
import timeit
from pathlib import Path
from typing import NamedTuple

from benchmarks.common import Child, Cleanup, Row, Settings, connect, watch_drain
from benchmarks.ledger_flusher import flusher_row
from benchmarks.ledger_micro import micro_row
from benchmarks.procfs import CSTIME, CUTIME, STIME, UTIME, cmdline, cpu_seconds, stat_fields, ticks
from benchmarks.rewardq_bench import done_count, fill, start_workers
from benchmarks.workload import Workload

#: Seconds the ledger collects before a flush in these runs (the default is 60 s, or 128 MB of
#: spool: ~1,700 trajectories of this workload, what 10 s collects at 120-170 trajectories/s).
FLUSH = 10.0
#: ``--quick``'s flush interval: its backlogs drain in a few seconds, and a quick run checks what the
#: benchmark reports, not the cost of a realistic file size.
QUICK_FLUSH = 2.0
#: Seconds waited after every drain beyond FLUSH (with or without the ledger), for its last flush.
SETTLE = 2.5


def _flush(s: Settings) -> float:
    return QUICK_FLUSH if s.quick else FLUSH


def _ledger_rows(folder: Path) -> int:
    import pyarrow.dataset as pads

    if not any(folder.rglob("*.parquet")):
        return 0
    return int(pads.dataset(str(folder), format="parquet", ignore_prefixes=["_", "."]).count_rows())


class _Cpu(NamedTuple):
    """CPU seconds so far of a worker's process tree, by part (``/proc/<pid>/stat``)."""

    worker: float  #: the worker process alone, every thread (the scoring loop, inline scorers, the spool's writes)
    flusher: float  #: its ledger flusher process (0 without the ledger)
    children: float  #: its other processes, alive (scorer processes) or exited and reaped by it
    worker_sys: float  #: the worker process's kernel part

    @property
    def tree(self) -> float:
        return self.worker + self.flusher + self.children


def _split_cpu(child: Child) -> _Cpu:
    """The CPU of ``child``'s whole process tree so far, by part: what a worker spends on its user's
    behalf wherever it runs. A child that exited and was waited for counts in its parent's
    ``cutime``/``cstime``, so its CPU stays counted after it is gone."""
    flusher = others = 0.0
    for pid in child.tree():
        if pid == child.pid:
            continue
        if "rewardq.ledger.flusher" in cmdline(pid):
            flusher += cpu_seconds(pid)
        else:
            others += cpu_seconds(pid)
    fields = stat_fields(child.pid)
    if fields is None:
        return _Cpu(0.0, flusher, others, 0.0)
    reaped = ticks(fields, CUTIME, CSTIME)
    return _Cpu(ticks(fields, UTIME, STIME), flusher, others + reaped, ticks(fields, STIME))


def _flusher_settled(child: Child, timeout: float = 30.0) -> float:
    """Wait until the worker's flusher process has started (imported pyarrow, warmed Arrow up: ~0.5 s
    of CPU, once per worker) and idles, so the drain's window holds what it costs per trajectory,
    not its start; returns the CPU seconds its start took."""
    deadline = time.monotonic() + timeout
    last = -1.0
    while time.monotonic() < deadline:
        now = _split_cpu(child).flusher
        if now > 0 and now == last:
            return now
        last = now
        time.sleep(0.5)
    return last


def drain(s: Settings, cleanup: Cleanup, ledger: Path | None, rnd: int) -> Row:
    """One drain of ``s.trajectories`` by one worker, with the ledger at ``ledger`` or without."""
    on = ledger is not None
    ns = s.prefix(f"ledger-{'on' if on else 'off'}-{rnd}")
    cleanup.add(f"{ns}:*")
    nt, no = fill(s.redis_url, ns, Workload(s.seed, tag=f"lg{rnd}-").range(0, s.trajectories))
    flush = _flush(s)
    extra = ["--ledger", str(ledger), "--ledger-flush-interval", str(flush)] if ledger is not None else []
    [child] = start_workers(s, ns, 1, f"{s.run_id}-lg{rnd}{'on' if on else 'off'}", extra)
    r = connect(s.redis_url)
    try:
        started = _flusher_settled(child) if on else 0.0
        split0 = _split_cpu(child)
        child.go()
        d = watch_drain(lambda: done_count(r, ns), nt, s.drain_timeout, alive=child.alive)
        end = time.monotonic() + flush + SETTLE  # the same window with and without the ledger
        rows = 0
        while time.monotonic() < end:
            time.sleep(0.5)
            if ledger is not None and rows < no:
                rows = _ledger_rows(ledger)
        split = _split_cpu(child)
        if ledger is not None and rows < no:
            deadline = time.monotonic() + 30
            while (rows := _ledger_rows(ledger)) < no and time.monotonic() < deadline:
                time.sleep(0.2)
            split = _split_cpu(child)
        row = Row(
            "rewardq+ledger" if on else "rewardq",
            "ledger A/B",
            outputs=no,
            rss_mb=child.peak_rss_mb(),
            note=f"round {rnd}; CPU from the drain's start to {flush + SETTLE:g}s after its end"
            + (f"; {rows:,} ledger rows, flushed every {flush:g}s" if on else ""),
            **d.row_fields(nt, no),
        )
        per = 1000.0 / max(1, d.last_count)
        row.cpu_ms = per * (split.tree - split0.tree)
        row.extra["worker_cpu_ms"] = per * (split.worker - split0.worker)
        row.extra["flusher_cpu_ms"] = per * (split.flusher - split0.flusher)
        row.extra["children_cpu_ms"] = per * (split.children - split0.children)
        row.extra["worker_sys_ms"] = per * (split.worker_sys - split0.worker_sys)
        row.extra["tree_processes"] = len(child.tree())
        row.extra["load"] = os.getloadavg()[0]
        row.extra["flusher_start_cpu_s"] = started
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
    extra = ["--ledger", str(ledger), "--ledger-flush-interval", str(_flush(s))] if ledger is not None else []
    [child] = start_workers(s, ns, 1, f"{s.run_id}-lglat{rnd}", extra)
    try:
        if on:
            _flusher_settled(child)  # its start, once per worker, outside the window as in the drains
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
    """Drains off/on/on/off (one round with --quick, three otherwise), latency off/on/off, where the
    ledger's CPU goes, provenance."""
    rows: list[Row] = [provenance_row(), micro_row(s.seed, s.trajectories, 1 if s.quick else 5)]
    rows.append(flusher_row(s.seed, min(s.trajectories, 3000), rounds=1 if s.quick else 3))
    folder = s.workdir / "ledger"
    rounds = 1 if s.quick else 3
    if "throughput" in s.phases:
        for rnd in range(1, rounds + 1):
            for on in (False, True, True, False):
                rows.append(drain(s, cleanup, folder if on else None, rnd))
                shutil.rmtree(folder, ignore_errors=True)
    if "latency" in s.phases:
        rows.append(latency(s, cleanup, None, 1))
        rows.append(latency(s, cleanup, folder, 1))
        shutil.rmtree(folder, ignore_errors=True)
        rows.append(latency(s, cleanup, None, 2))
    return rows
