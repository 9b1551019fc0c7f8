"""The issue's check: a fleet of `rewardq worker` processes with a ledger scores 500 mixed
trajectories while one worker is SIGKILLed; every acknowledged key is in the ledger, which
pandas, DuckDB, polars and Hugging Face datasets read with the documented columns."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from rewardq import RewardClient
from rewardq.ledger.read import read_table
from rewardq.ledger.schema import COLUMN_NAMES, COLUMNS
from tests.support.cli_procs import Procs, wait_for, worker_argv
from tests.support.ledger_workload import REWARDS, mixed_trajectories, push_all

REPO = Path(__file__).resolve().parents[2]
FAST = ["--heartbeat-interval", "0.2", "--lease-seconds", "2", "--maintenance-interval", "0.2"]
FAST += ["--claim-idle", "1", "--block-ms", "100", "--concurrency", "8", "--batch-size", "16"]


def documented_columns() -> list[tuple[str, str]]:
    """The schema table of docs/ledger.md: (column, type) in order."""
    text = (REPO / "docs" / "ledger.md").read_text()
    table = text.split("## Schema (version 1)", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_]+)` \| ([^|]+?) \|", table, flags=re.M)


def test_docs_list_exactly_the_written_columns() -> None:
    assert documented_columns() == [(c.name, c.type) for c in COLUMNS]


@pytest.mark.slow
def test_sigkilled_worker_loses_no_acknowledged_key(procs: Procs, ns: str, redis_url: str, tmp_path: Path) -> None:
    # Given two workers writing one ledger, and 500 mixed trajectories
    ledger = str(tmp_path / "ledger")
    extra = ["--reward-fn", REWARDS, "--ledger", ledger, "--ledger-flush-interval", "1", *FAST]
    a = procs.start(worker_argv(redis_url, ns, "wa", *extra), tag="wa")
    b = procs.start(worker_argv(redis_url, ns, "wb", *extra), tag="wb")
    client = RewardClient.from_url(redis_url, namespace=ns)
    trajs = mixed_trajectories(500, seed=11)
    keys = push_all(client, trajs)

    def done(by: str | None = None) -> int:
        return sum(1 for v in client.get_rewards(keys).values() if v is not None and by in (None, v.worker))

    # When one of them is SIGKILLed mid-run, once it has committed results of its own (on a loaded
    # machine the other may have done the first quarter alone)
    wait_for(lambda: done() >= len(keys) // 4 and done("wa") > 0, 120, "a quarter of the results", procs=[a, b])
    a.popen.send_signal(signal.SIGKILL)
    a.wait(10)
    # ... and the other one finishes the run (reclaiming what the dead one held) and stops
    wait_for(lambda: done() == len(keys), 180, "every result", procs=[b])
    results = client.get_rewards(keys)
    client.close()
    assert b.terminate(60) == 0, b.stderr()[-2000:]
    # Then every acknowledged key is in the ledger, with the reward and status Redis holds
    table = read_table(ledger)
    rows = {r["key"]: r for r in table.to_pylist()}
    missing = [k for k in keys if k not in rows]
    assert not missing, f"{len(missing)} acknowledged keys missing from the ledger, e.g. {missing[:3]}"
    for k, res in results.items():
        assert res is not None
        row = rows[k]
        assert (row["status"], row["reward_score"], row["worker"]) == (res.status, res.reward_score, res.worker), k
        assert row["committed"] is not False
    assert {r["worker"] for r in rows.values()} == {"wa", "wb"}  # the dead worker's spooled rows were adopted
    assert not list(Path(ledger).rglob("*.wal")), "segments left in the spool"
    raw = read_table(ledger, dedup=False)
    assert raw.num_rows >= len(keys)  # at least once: a trajectory scored again has two rows
    # And pandas, DuckDB, polars and datasets read it, with the documented columns
    import datasets
    import duckdb
    import pandas as pd
    import polars as pl

    files = f"{ledger}/**/*.parquet"
    df = pd.read_parquet(ledger)
    assert [c for c in df.columns if c not in ("date", "hour")] == list(COLUMN_NAMES)
    assert len(df) == raw.num_rows and set(df["key"]) == set(keys)
    con = duckdb.connect()
    [(n, distinct)] = con.sql(f"SELECT count(*), count(DISTINCT key) FROM read_parquet('{files}')").fetchall()
    assert (n, distinct) == (raw.num_rows, len(keys))
    deduped = con.sql(
        f"""SELECT key, reward_score FROM read_parquet('{files}', hive_partitioning = true)
            QUALIFY row_number() OVER (PARTITION BY key
                ORDER BY committed IS NOT DISTINCT FROM false, attempt DESC, scored_at DESC) = 1"""
    ).fetchall()
    assert {k: s for k, s in deduped} == {k: rows[k]["reward_score"] for k in keys}
    assert pl.read_parquet(files).columns == list(COLUMN_NAMES)
    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.column_names == list(COLUMN_NAMES) and ds.num_rows == raw.num_rows
