"""Child processes that start a timed run at one moment, whatever their start-up took.

A fixed start (``time.time() + 3``) assumed every child imported and connected within 3 s; on a
loaded 2-core machine a child's imports alone took longer, so it started late and the run measured
a fleet with a missing member. Here each child says ``READY`` once set up and reads the start time
from its stdin; the parent sends it once every child is ready. A child script calls
``start_at = float(sys.stdin.readline())`` after printing ``READY``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence

READY = "READY"
#: The start is this far after the last child said it was ready: every child is waiting on its stdin.
LEAD = 0.5


def start_together(procs: Sequence[subprocess.Popen[str]]) -> float:
    """Wait until every child printed ``READY`` (started with ``stdin`` and ``stdout`` pipes, text
    mode), then send them one start time (``time.time()`` seconds); returns it. A child that hangs
    before it is ready is left to the suite's per-test timeout."""
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()  # a child that dies first ends its stdout: an empty line
        assert line.strip() == READY, f"child {p.pid} did not get ready: {line!r} (exit code {p.poll()})"
    start_at = time.time() + LEAD
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{start_at!r}\n")
        p.stdin.flush()  # (left open: ``communicate`` closes it)
    return start_at
