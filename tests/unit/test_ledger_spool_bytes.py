"""The spooled bytes a worker counts against ``ledger_spool_max_bytes`` include the segments an
earlier life of its name left unwritten."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.ledger_facts import facts, make_ledger


def test_a_restarted_worker_counts_the_segments_it_left_as_spooled_until_they_are_written(tmp_path: Path) -> None:
    # Given worker w1 that spooled two trajectories and stopped before writing them
    first = make_ledger(tmp_path)
    for uid in "ab":
        first.settle(first.scored(facts(uid), {}), True)
    first.spool.write_outcomes()
    first.spool.seal()
    first.spool.close()
    left = sum(p.stat().st_size for p in (tmp_path / "spool").glob("*.wal"))
    assert left > 0
    # When w1 starts again, its leftovers are spooled bytes not yet written
    again = make_ledger(tmp_path)
    assert again.snapshot()["pending_bytes"] == left
    # and what it spools next counts whole once they are written
    again.settle(again.scored(facts("c"), {}), True)
    spooled = again.snapshot()["pending_bytes"] - left
    assert spooled > 0
    asyncio.run(again.flush_due())  # the leftovers only: the current segment is not due
    assert not list((tmp_path / "spool").glob(f"w1.{first.spool.spool_id}-*.wal"))
    assert again.snapshot()["pending_bytes"] == spooled
    asyncio.run(again.close(10))
