"""A worker started again under the same ``--name`` keeps every row its earlier lives wrote: real
`rewardq worker` processes, stopped by SIGTERM and by SIGKILL, on the real Redis."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from rewardq import RewardClient
from rewardq.ledger.read import read_table
from rewardq.ledger.sink import Ledger
from tests.support.cli_procs import START_WAIT, Procs, wait_for, worker_argv
from tests.support.ledger_workload import REWARDS, mixed_trajectories, push_all

FAST = ["--heartbeat-interval", "0.2", "--lease-seconds", "2", "--maintenance-interval", "0.2"]
FAST += ["--claim-idle", "1", "--block-ms", "100"]


def _files(ledger: str) -> dict[Path, int]:
    """The ledger's Parquet files and when each was last written."""
    return {p: p.stat().st_mtime_ns for p in Path(ledger).rglob("*.parquet")}


def test_a_worker_started_again_under_its_name_loses_no_earlier_row(
    procs: Procs, ns: str, redis_url: str, tmp_path: Path
) -> None:
    ledger = str(tmp_path / "ledger")
    argv = worker_argv(redis_url, ns, "w1", "--reward-fn", REWARDS, "--ledger", ledger, *FAST)
    argv += ["--ledger-flush-interval", "1"]
    client = RewardClient.from_url(redis_url, namespace=ns)
    results: dict[str, Any] = {}

    def score(trajs: list[dict[str, Any]], tag: str) -> Any:
        keys = push_all(client, trajs)
        p = procs.start(argv, tag=tag)
        wait_for(lambda: all(client.get_rewards(keys).values()), START_WAIT, f"{tag}'s results", procs=[p])
        results.update(client.get_rewards(keys))
        return p

    # Given worker w1 that scored trajectories and was stopped (SIGTERM: its spool is empty again)
    first = score(mixed_trajectories(12, seed=1), "first")
    assert first.terminate(60) == 0, first.stderr()[-2000:]
    assert read_table(ledger, dedup=False).num_rows == len(results)
    before = _files(ledger)
    # When w1 is started again within the hour, scores more, writes a file and is SIGKILLed
    again = score(mixed_trajectories(6, seed=2), "again")
    wait_for(lambda: _files(ledger) != before, 60, "a file written by the second worker", procs=[again])
    again.popen.send_signal(signal.SIGKILL)
    again.wait(10)
    # ... and another worker on the host adopts what its spool still held
    adopter = Ledger(ledger, worker="adopter", flush_interval=60.0, file_bytes=1 << 20, spool_max_bytes=1 << 30)
    adopter.open()
    asyncio.run(adopter.close(30))
    client.close()
    # Then every key of both lives is in the ledger, with the result Redis holds
    rows = {r["key"]: r for r in read_table(ledger).to_pylist()}
    assert set(rows) == set(results), f"{len(set(results) - set(rows))} keys lost"
    for key, res in results.items():
        assert (rows[key]["status"], rows[key]["reward_score"]) == (res.status, res.reward_score), key
    assert not list(Path(ledger).rglob("*.wal"))
