"""The main suite's tail, for CI (``.ci/run``): tests/verl starts once most of the suite's xdist workers are done.

xdist's controller hands out the suite's work while any is left; a worker with nothing left to take
finishes its last tests and goes down, so from the first one down the machine has cores to spare.
With ``REWARDQ_CI_TAIL_FILE`` set, the controller creates that file once no more than
``REWARDQ_CI_TAIL_WORKERS`` (default 2) of its workers still run, and when the run ends it says when
each worker went down (seconds since the session started), so a CI log shows how long the tail was.
Without the variable nothing changes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

FILE = "REWARDQ_CI_TAIL_FILE"
WORKERS = "REWARDQ_CI_TAIL_WORKERS"


class Tail:
    """The controller's count of its xdist workers: started, and the times they went down."""

    def __init__(self) -> None:
        self.started_at = time.monotonic()
        self.started = 0
        self.down: list[float] = []

    def node_started(self) -> None:
        self.started += 1

    def node_down(self) -> None:
        self.down.append(time.monotonic() - self.started_at)
        target = os.environ.get(FILE)
        if target and self.started - len(self.down) <= self.limit():
            Path(target).touch()

    def summary(self, reporter: pytest.TerminalReporter) -> None:
        if os.environ.get(FILE) and self.down:
            done = ", ".join(f"{t:.0f}" for t in self.down)
            reporter.write_line(f"xdist workers done at {done} s (the tail file was set with {self.limit()} left)")

    @staticmethod
    def limit() -> int:
        return int(os.environ.get(WORKERS, "2"))
