"""Hand-made ledgers for the read-side commands (replay's plan, diff, report): rows written as
Parquet files in the documented layout, without a worker."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rewardq.ledger.schema import COLUMN_NAMES, arrow_schema

#: When the rows of :func:`trajectory_rows` were scored (the first trajectory; one second apart).
T0 = dt.datetime(2026, 12, 7, 13, 0, tzinfo=dt.timezone.utc)


def trajectory_rows(
    uid: str,
    n: int = 2,
    *,
    complete: bool = True,
    status: str = "ok",
    score: float = 1.0,
    data_source: str = "openai/gsm8k",
    second: int = 0,
) -> list[dict[str, Any]]:
    """The ledger rows of trajectory ``<uid>_0`` with ``n`` outputs; ``complete=False``: one ended
    by ``incomplete_timeout`` (outputs 0..n-1 arrived, none final), as a worker writes it: never
    scored (attempt 0, no provenance, no manager time), its latency the 45 s it waited."""
    ids = np.arange(1, 9, dtype="<i4").tobytes()
    rows = []
    for i in range(n):
        ok = status == "ok" and complete
        rows.append(
            {
                "schema_version": 1,
                "key": f"{uid}_0_{i}",
                "uid": uid,
                "session_id": "0",
                "index": i,
                "final": complete and i == n - 1,
                "outputs": n,
                "data_source": data_source,
                "ground_truth": '"8"',
                "extra_info": "{}",
                "sample": "{}",
                "prompt_ids": ids,
                "response_ids": ids,
                "prompt_length": 8,
                "response_length": 8,
                "extra_fields": "{}",
                "status": "ok" if ok else "error",
                "reward_score": score if ok else None,
                "error": None if ok else "incomplete trajectory" if not complete else "scorer failed",
                "failure_kind": None if ok else "input" if not complete else "scorer",
                "attempt": 1 if complete else 0,
                "committed": True,
                "scored_at": T0 + dt.timedelta(seconds=second),
                "latency_ms": 5.0 if complete else 45_000.0,
                "score_ms": 1.0 if complete else None,
                "provenance": "0123456789abcdef" if complete else None,
                "response": "8" if complete and i == n - 1 else None,
            }
        )
    return rows


def write_ledger(root: Path, rows: list[dict[str, Any]], part: str = "part-test-0") -> Path:
    """Write ``rows`` (missing columns null) as one file of a ledger at ``root``; returns ``root``."""
    schema = arrow_schema()
    table = pa.Table.from_pylist([{c: r.get(c) for c in COLUMN_NAMES} for r in rows], schema=schema)
    folder = root / f"date={T0:%Y-%m-%d}" / f"hour={T0.hour}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / f"{part}.parquet")
    return root
