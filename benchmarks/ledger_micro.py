"""Where the ledger's CPU goes, in one process: the worker's spool write, then the flusher's steps.

Part of ``python -m benchmarks --only ledger`` (the ``ledger micro`` row): 1,000 trajectories of
the benchmark's workload (``--trajectories``, if fewer), encoded as a producer sends them and
decoded as the worker reads them, are spooled through the worker's own
:class:`~rewardq.ledger.sink.Ledger` (``scored`` and ``settle``, what the worker calls before and
after each commit), and the segment is then turned into Parquet by the flusher's own functions,
step by step as :func:`rewardq.ledger.flusher.write_segment` takes them: finding the frames'
maps (``scan``), reading each trajectory's records and decoding them (``decode``), building the
rows and a row group's Arrow table (``rows``), writing the row groups (``parquet``). CPU time of
this process, median of 5 rounds (``--quick``: 1); the first round warms the allocator and is
not counted (a flusher process writes segment after segment, its buffers kept). Unlike the drains, this has
no other process competing for the cores and no cold caches: it is the floor the drains'
figures sit above.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Row
from benchmarks.workload import Workload
from rewardq.queue.codec import OutputRecord

TRAJECTORIES = 1000
#: Per trajectory: its records as read, decoded, and its result rows as the commit encodes them.
Work = list[tuple[list[bytes], list[OutputRecord], list[list[bytes]]]]
STEPS = ("spool", "scan", "decode", "rows", "parquet")


def _workload(seed: int, n: int) -> Work:
    from rewardq.producers.core import prepare_trajectory
    from rewardq.queue.codec import decode_output
    from rewardq.queue.keys import Keyspace
    from rewardq.queue.results import RewardResult, encode_results

    ks = Keyspace("micro")
    out: Work = []
    for t in Workload(seed).range(0, n):
        payloads = []
        for put in prepare_trajectory(ks, t.uid, t.session_id, t.outputs(), t.sample(), max_bytes=1 << 26):
            data = put.fields["data"]
            assert isinstance(data, bytes)
            payloads.append(data)
        records = [decode_output(p) for p in payloads]
        results = [
            RewardResult(r.key, "ok", 1.0, {"acc": 1.0, "pred": "72"}, worker="w", manager="naive",
                         scored_at=time.time(), latency_ms=2.0, provenance="0123456789abcdef", attempt=1)
            for r in records
        ]  # fmt: skip
        out.append((payloads, records, encode_results(results, 1 << 20).rows))
    return out


def _round(work: Work, folder: Path) -> dict[str, float]:
    from rewardq.ledger import flusher
    from rewardq.ledger.frames import SegmentFile, TrajectoryFacts
    from rewardq.ledger.sink import Ledger
    from rewardq.ledger.store import LedgerStore
    from rewardq.ledger.table import SegmentRows, is_trajectory
    from rewardq.queue.results import RESULT_FIELDS

    ledger = Ledger(str(folder / "ledger"), worker="w", spool=str(folder / "spool"), flush_interval=1e9,
                    file_bytes=1 << 40, spool_max_bytes=1 << 40, flusher_process=False)  # fmt: skip
    ledger.open()
    blob = {"scoring": "0" * 16, "manager": "naive", "scorer": "default:gsm8k"}
    facts = [
        TrajectoryFacts(records, records[-1].sample, RESULT_FIELDS, rows, attempt=1, put_ts=time.time(),
                        score_ms=1.0, provenance="0123456789abcdef", response="The answer is 72", payloads=payloads)
        for payloads, records, rows in work
    ]  # fmt: skip
    took = dict.fromkeys(STEPS, 0.0)
    t = time.process_time()
    for f in facts:
        ledger.settle(ledger.scored(f, blob), True)
    took["spool"] = time.process_time() - t
    ledger.spool.seal()
    [segment] = ledger.spool.ready(all_=True)
    store = LedgerStore(str(folder / "ledger"))
    clock = time.process_time
    with segment.open("rb") as file, store.open("2026-01-01", 0, "part-micro") as out:
        seg = SegmentFile(file)
        t = clock()
        outcomes: dict[int, bool | None] = {}
        blobs: dict[str, Any] = {}
        trajectories = []
        for frame, start, raw in seg.frames():  # the flusher's first pass: the maps only
            if is_trajectory(frame, outcomes, blobs):
                trajectories.append((frame, start, raw))
        took["scan"] = clock() - t
        rows = SegmentRows(outcomes, blobs, flusher._BUFFERS)
        for frame, start, raw in trajectories:
            t0 = clock()
            seg.complete(frame, start, raw)
            t1 = clock()
            key = rows.add(frame)
            t2 = clock()
            took["decode"] += t1 - t0
            took["rows"] += t2 - t1
            if rows.id_bytes(key) >= flusher.ROW_GROUP_BYTES or frame is trajectories[-1][0]:
                table = rows.take(key)
                t3 = clock()
                assert table is not None
                out.write(table)
                del table
                took["rows"] += t3 - t2
                took["parquet"] += clock() - t3
        t = clock()
    took["parquet"] += clock() - t  # closing the file
    ledger.spool.close()
    return took


def micro_row(seed: int, trajectories: int = TRAJECTORIES, rounds_: int = 5) -> Row:
    """The ``ledger micro`` row (see the module doc): µs per trajectory of each step."""
    from rewardq.ledger.flusher import warm_up

    warm_up()
    n = max(1, min(trajectories, TRAJECTORIES))
    work = _workload(seed, n)
    rounds = []
    for i in range(rounds_ + 1):
        folder = Path(tempfile.mkdtemp(prefix="rewardq-ledger-micro-"))
        try:
            took = _round(work, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if i:
            rounds.append(took)
    us = {s: 1e6 * statistics.median(r[s] for r in rounds) / n for s in STEPS}
    flusher = sum(us[s] for s in STEPS[1:])
    row = Row(
        "rewardq+ledger",
        "ledger micro",
        trajectories=n,
        note=f"in-process, µs/trajectory (median of {rounds_}): worker spool write {us['spool']:.0f}; flusher "
        + ", ".join(f"{s} {us[s]:.0f}" for s in STEPS[1:])
        + f" = {flusher:.0f}",
    )
    row.extra = {f"{s}_us": us[s] for s in STEPS} | {"flusher_us": flusher, "load": os.getloadavg()[0]}
    return row


def main() -> None:
    """``python -m benchmarks.ledger_micro``: the row alone, its figures as JSON (with the load)."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--trajectories", type=int, default=TRAJECTORIES)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    row = micro_row(a.seed, a.trajectories, a.rounds)
    print(row.note)
    print(json.dumps(row.extra, indent=1))


if __name__ == "__main__":
    main()
