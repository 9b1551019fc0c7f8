"""The main suite's tail, for CI (``.ci/run``): tests/verl starts while the suite's last tests run.

The suite keeps its two cores only partly busy (most of an integration test is waiting): measured
on a loaded machine, 902 CPU-seconds for the whole run, which takes about 750 s on an idle 2-core
machine. Its four xdist workers stay busy until its last seconds (all four were done within 13 s of
each other), so the signal is the share of the suite's tests done, not a worker going idle.

With ``REWARDQ_CI_TAIL_FILE`` set, the xdist controller creates that file once
``REWARDQ_CI_TAIL_SHARE`` (default 0.9) of the collected tests have finished, and when the run ends
it says when that was and when each worker was done (seconds since the session started), so a CI
log shows how much the two parts overlapped. Without the variable nothing changes. The controller
takes both variables out of its environment as it reads them: the suite's own tests run pytest in
subprocesses, and those runs must not create the file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

FILE = "REWARDQ_CI_TAIL_FILE"
SHARE = "REWARDQ_CI_TAIL_SHARE"


class Tail:
    """The controller's count of finished tests and of its xdist workers going down."""

    def __init__(self) -> None:
        self.file = os.environ.pop(FILE, None)
        self.share = float(os.environ.pop(SHARE, "0.9"))
        self.started_at = time.monotonic()
        self.finished = 0
        self.signalled: float | None = None
        self.down: list[float] = []
        self.session: pytest.Session | None = None

    def watch(self, session: pytest.Session) -> None:
        """Count against this session's collected tests (xdist's controller sets their number)."""
        self.session = session

    def _now(self) -> float:
        return time.monotonic() - self.started_at

    def test_done(self) -> None:
        self.finished += 1
        collected = self.session.testscollected if self.session else 0
        if self.file and self.signalled is None and collected and self.finished >= self.share * collected:
            Path(self.file).touch()
            self.signalled = self._now()

    def node_down(self) -> None:
        self.down.append(self._now())

    def summary(self, reporter: pytest.TerminalReporter) -> None:
        if not self.file:
            return
        at = "never" if self.signalled is None else f"at {self.signalled:.0f} s"
        done = ", ".join(f"{t:.0f}" for t in self.down) or "-"
        reporter.write_line(f"tail file made {at} ({self.share:.0%} of the tests done); xdist workers done at {done} s")
