"""What every ledger row must say of its key: what the key's result in Redis says."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rewardq.queue.results import RewardResult


def assert_row_is_its_result(row: Mapping[str, Any], res: RewardResult) -> None:
    """``row`` (a ledger row, as ``read_table(...).to_pylist()`` gives it) says what result ``res``
    says: status, reward, kind, attempt (0 where Redis records none), provenance, manager; a key
    nothing scored (no provenance) names no scorer."""
    key = row["key"]
    assert (row["status"], row["reward_score"], row["failure_kind"]) == (
        res.status,
        res.reward_score,
        res.failure_kind,
    ), key
    assert row["attempt"] == res.attempt, (key, row["attempt"], res.attempt)
    assert (row["provenance"] or "") == res.provenance, (key, row["provenance"], res.provenance)
    assert (row["manager"] or "") == res.manager, (key, row["manager"], res.manager)
    if not res.provenance:
        assert row["scorer"] is None and row["scoring"] is None, key
