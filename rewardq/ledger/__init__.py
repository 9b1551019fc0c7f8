"""The reward ledger: a durable Parquet archive of every scored trajectory (docs/ledger.md).

Workers started with ``ledger`` set (``--ledger PATH_OR_URL``, ``REWARDQ_LEDGER``, ``ledger:`` in a
config file) write one row per output key: the sample, the output's ids, the decoded final
response, the result with its provenance, and timings.

* :mod:`.schema`: the columns (version 1), declared once;
* :mod:`.frames` and :mod:`.spool`: the write-ahead spool a worker appends to before each commit;
* :mod:`.table` and :mod:`.store`: spooled frames to hourly-partitioned Parquet on any fsspec URL;
* :mod:`.sink`: :class:`Ledger`, the worker's collaborator tying these together;
* :mod:`.read`: reading with filters, time ranges and one row per key.

Writing needs the ``ledger`` extra (pyarrow, fsspec); importing this package does not.
"""

from __future__ import annotations

from rewardq.ledger.schema import COLUMN_NAMES, COLUMNS, SCHEMA_VERSION

__all__ = ["COLUMNS", "COLUMN_NAMES", "SCHEMA_VERSION", "read_ledger", "read_table", "latest_rows"]


def __getattr__(name: str) -> object:
    # the readers need pyarrow (the `ledger` extra): imported when first used
    if name in ("read_ledger", "read_table", "latest_rows"):
        from rewardq.ledger import read

        return getattr(read, name)
    raise AttributeError(f"module 'rewardq.ledger' has no attribute {name!r}")
