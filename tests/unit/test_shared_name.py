"""Two live processes under one worker name, told apart from a restart and from a heartbeat Redis
brought back (rewardq.queue.liveness.Liveness._check_name)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rewardq.queue.keys import Keyspace
from rewardq.queue.liveness import Liveness


def _liveness() -> Liveness:
    none: Any = None
    return Liveness(none, Keyspace("ns"), none, "kb", 30.0, "mine")


def test_a_predecessor_or_one_restored_heartbeat_is_not_a_twin_two_beats_in_a_row_are(
    caplog: pytest.LogCaptureFixture,
) -> None:
    live = _liveness()
    with caplog.at_level(logging.ERROR, logger="rewardq.worker"):
        # the first beat finds the dead predecessor's life; later beats find this one's
        for before in ("dead", "mine", "mine"):
            live._check_name(before)
        # one beat finds an earlier life (a hash Redis brought back after a failover), then its own
        for again in ("dead", "mine", None, "mine"):
            live._check_name(again)
        assert live.shared_name_at == 0.0 and not caplog.records
        # a live twin: every beat finds the other life
        live._check_name("twin")
        assert live.shared_name_at == 0.0
        live._check_name("twin")
        assert live.shared_name_at > 0.0
        live._check_name("twin")  # said once a minute, not every beat
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "share --name kb" in said[0], said
