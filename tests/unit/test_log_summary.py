"""The worker's summary line: one INFO line per interval for everything that ended, none when idle."""

from __future__ import annotations

import logging

import pytest

from rewardq.consumers.log_summary import LogSummary


def test_one_line_sums_up_an_interval_and_an_idle_interval_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    summary = LogSummary("w0", clock=lambda: now[0])
    for i in range(2_000):
        summary.ended("ok" if i % 100 else "error", 4.0)
    now[0] = 130.0
    with caplog.at_level(logging.INFO, logger="rewardq.worker"):
        summary.emit(in_flight=7)
        now[0] = 160.0
        summary.emit(in_flight=0)  # nothing ended: no line
    assert len(caplog.records) == 1, caplog.text
    rec = caplog.records[0]
    assert rec.getMessage() == (
        "worker w0: 2,000 trajectories ended in the last 30s (ok 1,980, error 20; 66.7/s, 4.0 ms mean), 7 in flight"
    )
    assert rec.__dict__["outcomes"] == {"ok": 1980, "error": 20} and rec.__dict__["trajectories"] == 2000
