"""Reading a ledger: filters, time ranges and one row per key.

Any Parquet reader reads a ledger (docs/ledger.md has pandas, DuckDB, polars and ``datasets``
one-liners). This module is what rewardq's own commands use, and a shortcut for Python users::

    from rewardq.ledger import read_ledger
    df = read_ledger("s3://bucket/run-812/ledger", where={"data_source": ["openai/gsm8k"]},
                     since="2026-12-07T13:00")

**Duplicates.** Delivery is at-least-once, so a key can have more than one row: a worker killed
between spooling a trajectory and committing it leaves a row, and the trajectory is scored again
(``attempt`` + 1). :func:`latest_rows` keeps one row per ``key``: rows with ``committed = false``
(another attempt's result was written first) lose to any other, then the highest ``attempt``,
then the latest ``scored_at``. In SQL::

    SELECT * FROM ledger
    QUALIFY row_number() OVER (PARTITION BY key
        ORDER BY committed IS NOT DISTINCT FROM false, attempt DESC, scored_at DESC) = 1
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError
from rewardq.ledger.schema import COLUMN_NAMES, arrow_schema
from rewardq.ledger.store import open_filesystem

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.dataset as pads

Where = Mapping[str, Sequence[str]]


def parse_time(value: str | float | dt.datetime | None, what: str) -> dt.datetime | None:
    """An ISO time (``2026-12-07``, ``2026-12-07T13:00``, with or without a zone: UTC when none), unix
    seconds, or a datetime, as an aware UTC datetime; None stays None. ConfigError names ``what``."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        t = value
    elif isinstance(value, (int, float)):
        t = dt.datetime.fromtimestamp(float(value), tz=dt.timezone.utc)
    else:
        try:
            t = dt.datetime.fromtimestamp(float(value), tz=dt.timezone.utc)
        except ValueError:
            try:
                t = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            except ValueError:
                raise ConfigError(
                    f"{what} {value!r} is not a time: give ISO 8601 (2026-12-07T13:00, UTC unless it says "
                    "otherwise) or unix seconds"
                ) from None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def parse_where(items: Sequence[str]) -> dict[str, list[str]]:
    """``["data_source=openai/gsm8k", "status=ok"]`` -> ``{column: [values]}``; a column given
    twice matches either value. ConfigError for an unknown column or a missing ``=``."""
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"--where {item!r} is not COLUMN=VALUE (e.g. --where data_source=openai/gsm8k)")
        if name not in COLUMN_NAMES:
            raise ConfigError(f"--where {item!r}: no column {name!r}; the ledger's columns: {', '.join(COLUMN_NAMES)}")
        out.setdefault(name, []).append(value)
    return out


def open_dataset(url: str) -> pads.Dataset:
    """The ledger at ``url`` as a :class:`pyarrow.dataset.Dataset` (partition columns ``date``, ``hour``)."""
    import pyarrow as pa
    import pyarrow.dataset as pads

    fs, root = open_filesystem(url)
    if not fs.exists(root):
        raise ConfigError(f"no ledger at {url}: the folder does not exist (check the path or URL)")
    partitioning = pads.partitioning(pa.schema([("date", pa.string()), ("hour", pa.int32())]), flavor="hive")
    schema = arrow_schema()
    for f in partitioning.schema:
        schema = schema.append(f)
    return pads.dataset(
        root,
        filesystem=fs,
        format="parquet",
        partitioning=partitioning,
        schema=schema,
        ignore_prefixes=["_", "."],
    )


#: Columns every row of a key holds alike (they are the key's parts): a filter on them alone
#: selects whole keys, so it needs no second pass (:func:`read_table`).
KEY_COLUMNS = ("key", "uid", "session_id", "index")
#: How far outside a time range the rows of its keys are looked for, to keep one per key: a key's
#: attempts come within minutes of each other (a reclaim after ``claim_idle``, a retry after its
#: backoff), and a query over an hour should open a few hour folders, not every one. A key retried
#: by hand (``rewardq deadletters retry``) later than this is judged by the rows near the range.
NEAR = dt.timedelta(hours=2)


def _filter(where: Where | None, since: dt.datetime | None, until: dt.datetime | None, *, rows: bool = True) -> object:
    """The filter expression of ``where`` and a time range (None: no filter); ``rows=False``: the
    time range by hour folder only (``date``, ``hour``), not by each row's ``scored_at``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    expr = None

    def both(e: object) -> None:
        nonlocal expr
        expr = e if expr is None else expr & e

    schema = arrow_schema()
    for name, values in (where or {}).items():
        typ = schema.field(name).type
        try:
            if pa.types.is_boolean(typ):
                cast: list[Any] = [v.strip().lower() in ("1", "true", "yes") for v in values]
            elif pa.types.is_integer(typ):
                cast = [int(v) for v in values]
            elif pa.types.is_floating(typ):
                cast = [float(v) for v in values]
            else:
                cast = list(values)
        except ValueError:
            raise ConfigError(
                f"--where {name}={', '.join(values)}: not a number, and column {name} holds {typ}"
            ) from None
        both(pc.field(name).isin(cast))
    if since is not None:
        day, hour = since.astimezone(dt.timezone.utc).strftime("%Y-%m-%d"), since.astimezone(dt.timezone.utc).hour
        both((pc.field("date") > day) | ((pc.field("date") == day) & (pc.field("hour") >= hour)))
        if rows:
            both(pc.field("scored_at") >= pa.scalar(since, type=pa.timestamp("us", tz="UTC")))
    if until is not None:
        day, hour = until.astimezone(dt.timezone.utc).strftime("%Y-%m-%d"), until.astimezone(dt.timezone.utc).hour
        both((pc.field("date") < day) | ((pc.field("date") == day) & (pc.field("hour") <= hour)))
        if rows:
            both(pc.field("scored_at") < pa.scalar(until, type=pa.timestamp("us", tz="UTC")))
    return expr


def read_table(
    url: str,
    *,
    where: Where | None = None,
    since: str | float | dt.datetime | None = None,
    until: str | float | dt.datetime | None = None,
    columns: Sequence[str] | None = None,
    dedup: bool = True,
) -> pa.Table:
    """The ledger's rows (``columns`` of them; all by default), filtered, one per key when ``dedup``.

    With ``dedup`` the filters apply to each key's kept row, not to every row: a key whose
    superseded row matches (``status=error`` of an attempt that died) and whose kept row does not
    is left out. A filter on :data:`KEY_COLUMNS` alone selects whole keys in one read. Any other
    filter, or a time range, takes two: the keys any row matches, then every row of those keys
    (within :data:`NEAR` of the time range's hour folders, and matching the filter's key columns),
    one kept per key, and the filters applied to those."""
    t0, t1 = parse_time(since, "--since"), parse_time(until, "--until")
    wanted = list(columns or COLUMN_NAMES)
    expr = _filter(where, t0, t1)
    dataset = open_dataset(url)
    if not dedup:
        return dataset.to_table(columns=wanted, filter=expr)
    needed = [*wanted, "key", "attempt", "committed", "scored_at", *(where or {})]
    if t0 is not None or t1 is not None:
        needed += ["date", "hour"]
    needed = list(dict.fromkeys(needed))
    by_key = {name: values for name, values in (where or {}).items() if name in KEY_COLUMNS}
    if expr is None or (len(by_key) == len(where or {}) and t0 is None and t1 is None):
        return latest_rows(dataset.to_table(columns=needed, filter=expr)).select(wanted)
    import pyarrow.compute as pc

    keys = pc.unique(dataset.to_table(columns=["key"], filter=expr)["key"])
    near = _filter(by_key, t0 and t0 - NEAR, t1 and t1 + NEAR, rows=False)
    of_keys = pc.field("key").isin(keys)
    table = latest_rows(dataset.to_table(columns=needed, filter=of_keys if near is None else of_keys & near))
    return table.filter(expr).select(wanted)


def latest_rows(table: pa.Table) -> pa.Table:
    """One row per ``key`` (see the module doc), sorted by key."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return table
    superseded = pc.fill_null(pc.equal(table["committed"], False), False)
    ranked = table.append_column("__rank", pc.cast(superseded, pa.int8()))
    order = pc.sort_indices(
        ranked,
        sort_keys=[
            ("key", "ascending"),
            ("__rank", "ascending"),
            ("attempt", "descending"),
            ("scored_at", "descending"),
        ],
    )
    ranked = ranked.take(order)
    keys = ranked["key"]
    first = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))
    keep = pa.concat_arrays([pa.array([True]), *pc.fill_null(first, True).chunks])
    return ranked.filter(keep).drop_columns(["__rank"])


def read_ledger(url: str, **filters: Any) -> pd.DataFrame:
    """:func:`read_table` (same keyword arguments) as a pandas DataFrame."""
    return read_table(url, **filters).to_pandas()
