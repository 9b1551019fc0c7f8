"""The ledger's table: one row per output key, its columns declared once here.

:data:`COLUMNS` is the documented schema (docs/ledger.md renders it, a test checks the two agree):
every column's name, Arrow type and meaning. :func:`arrow_schema` turns it into the
:class:`pyarrow.Schema` every file is written with, so every file of every version-1 ledger has
exactly these columns in this order, whatever its rows held (a column none of its rows had is
null, never missing or typed differently), and pandas, DuckDB, polars and Hugging Face
``datasets`` read a whole ledger as one table.

Types are chosen for cheap writing and plain reading:

* token ids are little-endian ``int32`` packed into ``binary`` (``np.frombuffer(v, "<i4")``):
  Parquet's nested-list encoding costs ~3x more CPU per id than a binary value, and the writing
  happens in the ledger's flusher process (docs/performance.md); ``*_length`` columns
  give the counts without decoding;
* dicts that vary from row to row (``reward_extra_info``, ``extra_info``, ``sample``) are JSON
  text, as Redis holds them: a struct would give each file its own schema;
* times are ``timestamp[us, UTC]``.

Version 1. A change that removes, renames or retypes a column makes version 2 (written beside,
under its own ``schema_version``); adding a nullable column at the end keeps version 1 readable.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

#: The schema version this rewardq writes (the ``schema_version`` column and the files' metadata).
SCHEMA_VERSION = 1
#: The key of the schema version in each Parquet file's key-value metadata.
METADATA_KEY = b"rewardq.ledger.schema_version"


@dataclass(frozen=True)
class Column:
    """One column: its name, its Arrow type (as ``pyarrow`` spells it) and what it holds."""

    name: str
    type: str
    doc: str
    group: str


def _cols(group: str, *items: tuple[str, str, str]) -> list[Column]:
    return [Column(name, type_, doc, group) for name, type_, doc in items]


#: Every column of a version-1 ledger file, in file order.
COLUMNS: tuple[Column, ...] = tuple(
    _cols(
        "identity",
        ("schema_version", "int16", "The ledger schema version of this row (1)."),
        ("key", "string", "The output key `<uid>_<session_id>_<index>`."),
        ("uid", "string", "The sample's uid."),
        ("session_id", "string", "The trajectory's session id."),
        ("index", "int32", "The output's index in its trajectory (0-based)."),
        ("final", "bool", "True for the trajectory's final output (the one built-in managers score)."),
        ("outputs", "int32", "How many outputs the trajectory has."),
    )
    + _cols(
        "sample",
        ("data_source", "string", "The sample's `data_source` column."),
        ("ground_truth", "string", "JSON of `reward_model.ground_truth` (null when the sample has none)."),
        ("extra_info", "string", "JSON of the sample's `extra_info` column (null when absent)."),
        (
            "sample",
            "string",
            "JSON of every other dataset column (`raw_prompt`, `reward_model` without `ground_truth`, ...); "
            'bytes are written as `{"__bytes__": base64}`.',
        ),
    )
    + _cols(
        "output",
        ("prompt_ids", "binary", "The output's prompt token ids, little-endian int32."),
        ("response_ids", "binary", "The output's response token ids, little-endian int32."),
        ("response_mask", "binary", "1 byte per response token: 1 model-generated, 0 tool/observation (null: all 1)."),
        ("prompt_length", "int32", "Prompt tokens."),
        ("response_length", "int32", "Response tokens."),
        ("num_turns", "int32", "The output's `num_turns` (null when not given)."),
        ("extra_fields", "string", "JSON of the output's `extra_fields`."),
        ("rollout_reward_score", "float64", "A reward the rollout precomputed for the output (null when none)."),
        (
            "response",
            "string",
            "The decoded final response (`skip_special_tokens`), on the final output's row; null on the others.",
        ),
    )
    + _cols(
        "result",
        ("status", "string", "`ok` or `error`."),
        ("reward_score", "float64", "The reward written for the key (null for errors)."),
        ("reward_extra_info", "string", "JSON of the key's `reward_extra_info`, as stored in Redis."),
        ("error", "string", "Why scoring failed (null when ok)."),
        ("failure_kind", "string", "transient, timeout, scorer, config or input (null when ok)."),
        (
            "attempt",
            "int32",
            "The scoring attempt of the trajectory (1, or more after a crash or a lost lease; 0 for a "
            "trajectory ended by `incomplete_timeout`, never scored).",
        ),
        (
            "committed",
            "bool",
            "True: this row's result is the one written to Redis; false: another attempt's result was "
            "written first (this row is not what the trainer got); null: the worker died before it knew.",
        ),
    )
    + _cols(
        "timing",
        ("scored_at", "timestamp[us, tz=UTC]", "When the result was made."),
        ("put_at", "timestamp[us, tz=UTC]", "When the producer put the output that completed the trajectory."),
        ("latency_ms", "float64", "From that put to the result, in ms (the result hash's `latency_ms`)."),
        ("score_ms", "float64", "The manager's `run_single` (decoding and scoring), in ms."),
    )
    + _cols(
        "provenance",
        ("worker", "string", "The worker that scored it."),
        ("manager", "string", "The `--manager` it ran."),
        ("provenance", "string", "Digest of the provenance blob below (the result hash's `provenance` field)."),
        ("scoring", "string", "The namespace's scoring-configuration fingerprint (`rewardq status` shows it)."),
        ("rewardq_version", "string", "The rewardq version of the worker."),
        (
            "scorer",
            "string",
            "The scorer that ran: `default:<module>` for the data source's default scorer, "
            "`reward_fn:<file>:<function>@sha256=<digest>`, `manager:<spec>@sha256=<digest>` for a custom "
            "manager, `judge:<model>` or `reward_model:<model>`.",
        ),
        ("judge_model", "string", "The judge model (LLM-judge managers only)."),
        ("judge_template", "string", "SHA-256 (16 hex) of the judge's prompt or rubric template and system prompt."),
        ("judge_sampling", "string", "JSON of the judge's sampling parameters (temperature, max_tokens, n, ...)."),
        (
            "judge_request",
            "string",
            "SHA-256 of the judge request this key's reward came from: the key of its cached answer.",
        ),
        ("judge_answer", "string", "The judge's cached answer (JSON), so a replay reuses it instead of paying again."),
        ("isolation", "string", "How code ran for code data sources: `sandbox_fusion` or `local:<mode>`."),
    )
)

#: Column names in file order.
COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
#: The columns a reader needs to drop duplicate rows (:func:`rewardq.ledger.read.latest_rows`).
DEDUP_COLUMNS = ("key", "attempt", "committed", "scored_at")


def arrow_type(spec: str) -> pa.DataType:
    """The Arrow type a :class:`Column` names."""
    import pyarrow as pa

    if spec.startswith("timestamp"):
        return pa.timestamp("us", tz="UTC")
    return {
        "int16": pa.int16(),
        "int32": pa.int32(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
        "string": pa.string(),
        "binary": pa.binary(),
    }[spec]


@cache
def arrow_schema() -> pa.Schema:
    """The :class:`pyarrow.Schema` of a version-1 ledger file (with its version in the metadata);
    made once per process (every row group's table is made with it)."""
    import pyarrow as pa

    required = {"schema_version", "key", "uid", "session_id", "index", "final", "outputs", "status", "attempt"}
    fields = [pa.field(c.name, arrow_type(c.type), nullable=c.name not in required) for c in COLUMNS]
    return pa.schema(fields, metadata={METADATA_KEY: str(SCHEMA_VERSION).encode()})
