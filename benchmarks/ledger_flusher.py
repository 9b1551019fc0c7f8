"""The flusher process's own cost, CPU seconds and peak memory, on segments of the drains' workload.

Part of ``python -m benchmarks --only ledger`` (the ``ledger flusher`` row), and runnable alone
(``python -m benchmarks.ledger_flusher --trajectories 3000 --segments 2``). One segment of
``--trajectories`` trajectories of the benchmark's workload is spooled through the worker's own
:class:`~rewardq.ledger.sink.Ledger`, copied ``--segments`` times, and handed to a real flusher
process (``python -m rewardq.ledger.flusher``) one after the other, as a worker hands it its
segments. The process's CPU time (user + system) and peak resident set come from the kernel
(``/proc``), so the machine's load moves them little; the same is measured for a flusher process
that starts, warms up and gets no segment, and the difference is what the segments cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Row
from benchmarks.procfs import MINFLT, STIME, UTIME, cpu_seconds, stat_fields, status_kb, ticks


def spool_segment(folder: Path, seed: int, n: int) -> Path:
    """One sealed spool segment of ``n`` trajectories, as a worker writes it."""
    from benchmarks.ledger_micro import _workload
    from rewardq.ledger.frames import TrajectoryFacts
    from rewardq.ledger.sink import Ledger
    from rewardq.queue.results import RESULT_FIELDS

    ledger = Ledger(str(folder / "ledger"), worker="w", spool=str(folder / "spool"), flush_interval=1e9,
                    file_bytes=1 << 40, spool_max_bytes=1 << 40, flusher_process=False)  # fmt: skip
    ledger.open()
    blob = {"scoring": "0" * 16, "manager": "naive", "scorer": "default:gsm8k"}
    for payloads, records, rows in _workload(seed, n):
        facts = TrajectoryFacts(records, records[-1].sample, RESULT_FIELDS, rows, attempt=1, put_ts=time.time(),
                                score_ms=1.0, provenance="0123456789abcdef", response="The answer is 72",
                                payloads=payloads)  # fmt: skip
        ledger.settle(ledger.scored(facts, blob), True)
    ledger.spool.seal()
    [segment] = ledger.spool.ready(all_=True)
    ledger.spool.close()
    return segment


def run_flusher(url: str, segments: list[Path]) -> tuple[float, float, int, float, int]:
    """Hand ``segments`` to a fresh flusher process: its CPU seconds, peak RSS (MB), rows written,
    system CPU seconds and minor page faults."""
    proc = subprocess.Popen([sys.executable, "-m", "rewardq.ledger.flusher", url],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    rows = 0
    for path in segments:
        proc.stdin.write(json.dumps({"path": str(path), "owner": "w"}).encode() + b"\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        if "rows" not in answer:
            raise RuntimeError(f"the flusher answered {answer}")
        rows += int(answer["rows"])
    if not segments:
        _idle(proc.pid)
    # read before it exits: wait4's ru_maxrss would count this process's memory, which the child
    # had until its exec
    peak = (status_kb(proc.pid, "VmHWM") or 0) / 1024
    fields = stat_fields(proc.pid)
    if fields is None:
        raise RuntimeError(f"the flusher process {proc.pid} ended before it was measured")
    user, system, faults = ticks(fields, UTIME), ticks(fields, STIME), int(fields[MINFLT])
    proc.stdin.close()
    proc.wait()
    proc.stdout.close()
    return user + system, peak, rows, system, faults


def _idle(pid: int) -> None:
    """Wait until process ``pid`` has started and warmed up: its CPU time stops moving."""
    last = -1.0
    while (now := cpu_seconds(pid)) != last:
        last = now
        time.sleep(0.3)


def measure(
    seed: int, trajectories: int, segments: int, rounds: int = 3, template: Path | None = None
) -> dict[str, float]:
    """Median over ``rounds`` of the flusher's CPU and peak RSS, idle and with ``segments`` segments
    (copies of ``template``, spooled here unless given)."""
    import statistics

    work = Path(tempfile.mkdtemp(prefix="rewardq-ledger-flusher-"))
    try:
        if template is None:
            template = spool_segment(work / "make", seed, trajectories)
        size = template.stat().st_size
        idle, busy = [], []
        for _ in range(rounds):
            idle.append(run_flusher(str(work / "idle"), []))
            paths = []
            for k in range(segments):
                path = work / f"w.{k:010d}.wal"
                shutil.copyfile(template, path)
                paths.append(path)
            out = work / "ledger"
            busy.append(run_flusher(str(out), paths))
            shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    n = trajectories * segments
    return {
        "segment_mb": size / 1e6,
        "idle_cpu_s": med(r[0] for r in idle),
        "idle_rss_mb": med(r[1] for r in idle),
        "cpu_s": med(r[0] for r in busy),
        "rss_mb": med(r[1] for r in busy),
        "cpu_ms_per_trajectory": 1000 * (med(r[0] for r in busy) - med(r[0] for r in idle)) / n,
        "sys_ms_per_trajectory": 1000 * (med(r[3] for r in busy) - med(r[3] for r in idle)) / n,
        "minor_faults": med(r[4] for r in busy) - med(r[4] for r in idle),
        "rows": busy[0][2],
        "load": os.getloadavg()[0],
    }


def flusher_row(seed: int, trajectories: int, segments: int = 2, rounds: int = 3) -> Row:
    """The ``ledger flusher`` row (see the module doc)."""
    m = measure(seed, trajectories, segments, rounds)
    row = Row(
        "rewardq+ledger",
        "ledger flusher",
        trajectories=trajectories * segments,
        rss_mb=m["rss_mb"],
        note=f"flusher process, {segments} segment(s) of {trajectories} trajectories ({m['segment_mb']:.0f} MB each): "
        f"{m['cpu_ms_per_trajectory']:.3f} ms CPU/trajectory beyond its start ({m['idle_cpu_s']:.2f} s); "
        f"peak RSS {m['rss_mb']:.0f} MB (idle {m['idle_rss_mb']:.0f} MB); median of {rounds}",
    )
    row.cpu_ms = m["cpu_ms_per_trajectory"]
    row.extra = m
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trajectories", type=int, default=3000)
    p.add_argument("--segments", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--segment", type=Path, help="a segment file to use (spooled there first if missing)")
    a = p.parse_args()
    template = a.segment
    if template is not None and not template.exists():
        made = spool_segment(Path(tempfile.mkdtemp(prefix="rewardq-ledger-flusher-")), a.seed, a.trajectories)
        shutil.move(made, template)
    print(json.dumps(measure(a.seed, a.trajectories, a.segments, a.rounds, template), indent=1))


if __name__ == "__main__":
    main()
