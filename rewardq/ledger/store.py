"""Where ledger files go: a local folder or any fsspec URL, partitioned by hour.

Layout under the ledger root (Hive-style partitions, which pandas, DuckDB, polars and
``datasets`` all understand)::

    _rewardq_ledger.json                      what this folder is, its schema version and columns
    date=2026-12-07/hour=13/part-<worker>-<spool id>-<seq>.parquet
    date=2026-12-07/hour=14/...
    _spool/<host>/...                         the workers' write-ahead spool (local ledgers only)

A day of a 1,000-GPU run is 24 hour folders, each holding one file per worker per flush (every
``ledger_flush_interval`` seconds, or ``ledger_file_bytes`` of spool): a query over an hour or a
data source's day reads only those folders, and a file's row groups carry min/max statistics of
``scored_at`` and ``data_source`` for the rest. File names are made from the spool segment they
come from (:func:`~rewardq.ledger.spool.part_name`), so a segment flushed twice (its worker died
after writing the file, before deleting the segment) overwrites its own file instead of adding a
copy, and no other segment's file.

Writes go to a temporary name and are renamed into place on a local folder (fsynced before the
rename and the folder after it, so the flusher deletes a spool segment only once its rows are on
the disk) and on fsspec's ``memory://``; on every other fsspec filesystem the file is written in
place, which object stores make visible whole when it is closed (:func:`write_whole` says what
that means elsewhere). Names starting with ``_`` or ``.`` are skipped by every reader.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError
from rewardq.ledger.schema import COLUMNS, SCHEMA_VERSION

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from fsspec import AbstractFileSystem

logger = logging.getLogger("rewardq.ledger")

MANIFEST = "_rewardq_ledger.json"
#: Columns whose values repeat from row to row (dictionary-encoded); the others are written plain.
_DICTIONARY = [
    "uid",
    "session_id",
    "data_source",
    "ground_truth",
    "extra_info",
    "sample",
    "status",
    "failure_kind",
    "worker",
    "manager",
    "provenance",
    "scoring",
    "rewardq_version",
    "scorer",
    "judge_model",
    "judge_template",
    "judge_sampling",
    "isolation",
]
#: Token ids look random to a compressor (~1.1-1.5x for 3x the CPU): written uncompressed.
_UNCOMPRESSED = ("prompt_ids", "response_ids")
#: The bulky columns that compress: LZ4, which wrote a file of the benchmark's workload in 84 % of
#: zstd's CPU time for 4 % more bytes. The other columns are small: zstd.
_FAST = ("response", "response_mask")
#: Rows Arrow encodes at a time, and so the fewest a data page holds: with its default (1,024)
#: a page of ids was a whole row group's (8-16 MB), each one new memory for Arrow's buffers.
_BATCH_ROWS = 64
#: Columns with min/max statistics (what queries filter on).
_STATISTICS = ["key", "index", "data_source", "status", "failure_kind", "scored_at", "attempt", "worker"]


def open_filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem and root path of a ledger URL or local folder."""
    from fsspec.core import url_to_fs

    fs, root = url_to_fs(url)
    return fs, str(root).rstrip("/") or "/"


def is_local(url: str) -> bool:
    """Whether the ledger is a local folder (``/path``, ``file://``)."""
    return "://" not in url or url.startswith("file://")


def partition_dir(root: str, date: str, hour: int) -> str:
    return f"{root}/date={date}/hour={hour:02d}"


class LedgerStore:
    """Writes ledger files under ``url`` (see the module doc)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.root = open_filesystem(url)
        self._renames = "file" in _protocols(self.fs) or "memory" in _protocols(self.fs)
        self._local = "file" in _protocols(self.fs)
        self._manifest_done = False

    def write(self, table: pa.Table, date: str, hour: int, name: str) -> str:
        """Write ``table`` as ``date=<date>/hour=<hour>/<name>.parquet``; returns the path."""
        with self.open(date, hour, name) as file:
            file.write(table)
        return file.path

    def open(self, date: str, hour: int, name: str) -> LedgerFile:
        """A file ``date=<date>/hour=<hour>/<name>.parquet`` to write row group by row group; it
        appears (whole) when closed."""
        folder = partition_dir(self.root, date, hour)
        self.fs.makedirs(folder, exist_ok=True)
        path = f"{folder}/{name}.parquet"
        target = f"{folder}/_tmp-{secrets.token_hex(6)}-{name}.parquet" if self._renames else path
        return LedgerFile(self, path, target)

    def _placed(self, file: LedgerFile) -> None:
        if self._local:  # on the disk before its segment is deleted: a power loss keeps one of the two
            _fsync_file(self.fs._strip_protocol(file.target))
        if file.target != file.path:
            self.fs.mv(file.target, file.path)
        if self._local:
            _fsync_folder(self.fs._strip_protocol(file.path).rsplit("/", 1)[0])
        if not self._manifest_done:
            self.write_manifest()

    def write_manifest(self) -> None:
        """``_rewardq_ledger.json``: the schema version and columns (readers skip ``_`` files)."""
        from rewardq import __version__

        body: Mapping[str, Any] = {
            "what": "rewardq reward ledger: one row per output key (docs/ledger.md)",
            "schema_version": SCHEMA_VERSION,
            "layout": "date=YYYY-MM-DD/hour=HH/part-<worker>-<spool id>-<seq>.parquet (UTC hour of scored_at)",
            "dedup": "per key: drop committed = false, keep the highest attempt, then the latest scored_at",
            "columns": {c.name: c.type for c in COLUMNS},
            "written_by": f"rewardq {__version__}",
        }
        write_whole(self.fs, self.root, MANIFEST, json.dumps(body, indent=1).encode())
        self._manifest_done = True


class LedgerFile:
    """One ledger file being written (:meth:`LedgerStore.open`): each :meth:`write` adds a row
    group; :meth:`close` puts the file in place, and leaving a ``with`` block by an exception
    removes what was written."""

    def __init__(self, store: LedgerStore, path: str, target: str) -> None:
        self.store, self.path, self.target = store, path, target
        self._writer: pq.ParquetWriter | None = None
        self._file: Any = None

    def write(self, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            options: dict[str, Any] = dict(
                compression={c: _codec(c) for c in table.column_names},
                use_dictionary=_DICTIONARY,
                write_statistics=_STATISTICS,
                write_batch_size=_BATCH_ROWS,
            )
            if self.store._local:  # Arrow's own file writer: no Python file object copying every page it writes
                self._writer = pq.ParquetWriter(self.target, table.schema, **options)
            else:
                self._file = self.store.fs.open(self.target, "wb")
                self._writer = pq.ParquetWriter(self._file, table.schema, **options)
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))

    def close(self) -> None:
        if self._writer is None:
            return  # nothing written: no file
        self._writer.close()
        if self._file is not None:
            self._file.close()
        self.store._placed(self)

    def __enter__(self) -> LedgerFile:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if kind is None:
            self.close()
            return
        try:
            if self._writer is not None:
                self._writer.close()
            if self._file is not None:
                self._file.close()
            if self._writer is not None:
                self.store.fs.rm(self.target)
        except Exception:  # noqa: BLE001 - the first failure is what the caller reports
            pass


def write_whole(fs: AbstractFileSystem, folder: str, name: str, data: bytes) -> None:
    """Write ``data`` as ``<folder>/<name>`` (the folder made if missing), never leaving it cut.

    * A local folder: written under a temporary name, fsynced, renamed into place, and the folder
      fsynced, so a reader, a stopped process or a power loss finds the previous file (or none)
      or the new one whole, never an empty or cut one. ``memory://`` renames the same way.
    * An object store (``s3://``, ``gs://``, ``az://``...): written in place. fsspec uploads a
      file opened for writing when it is closed: one PUT, or a multipart upload completed at
      close, and an object store makes an object visible only whole, replacing the previous one
      whole; an upload never completed (a process stopped midway) leaves the previous object.
    * Any other fsspec filesystem (SFTP, SMB, HDFS, FTP...): written in place too, and those
      write into the named file as the data arrives, so a process stopped midway can leave it cut
      there.

    A write that fails removes its temporary file; the previous file, if any, stays as it was."""
    fs.makedirs(folder, exist_ok=True)
    path = f"{folder}/{name}"
    local = "file" in _protocols(fs)
    if not local and "memory" not in _protocols(fs):
        with fs.open(path, "wb") as f:
            f.write(data)
        return
    temporary = f"{folder}/_tmp-{secrets.token_hex(6)}-{name}"
    try:
        with fs.open(temporary, "wb") as f:
            f.write(data)
            if local:  # on the disk before the name points at it: a power loss leaves no empty file
                f.flush()
                os.fsync(f.fileno())
        fs.mv(temporary, path)
    except BaseException:
        try:
            fs.rm(temporary)
        except Exception:  # noqa: BLE001 - the first failure is what the caller reports
            pass
        raise
    if local:  # the rename itself, on the disk
        _fsync_folder(fs._strip_protocol(folder))


def _fsync_file(path: str) -> None:
    _fsync(path, os.O_RDONLY)


def _fsync_folder(folder: str) -> None:
    _fsync(folder, os.O_RDONLY | os.O_DIRECTORY)


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _codec(column: str) -> str:
    return "none" if column in _UNCOMPRESSED else "lz4" if column in _FAST else "zstd"


def _protocols(fs: AbstractFileSystem) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def local_path(url: str) -> str:
    """The folder a local ledger URL (``/path``, ``~/path``, ``file:///path``) names."""
    return os.path.expanduser(url[len("file://") :] if url.startswith("file://") else url)


def check_places(ledger: str, spool: str | None) -> None:
    """Refuse (ConfigError) a worker's spool folder (``ledger_spool``, else its default: inside a
    local ledger's folder, which is then refused by the name ``ledger``) when a writer could not
    make or write it (:func:`check_folder`): a worker with a ledger acknowledges nothing it has not
    spooled. A local ledger folder apart from its spool that cannot be written is a destination
    gone (a bucket deleted, a disk full): it never stops scoring, so it is logged as an error here
    and reported as failing once the flusher tries it; the rows wait in the spool."""
    if is_local(ledger):
        if spool is None:
            check_folder("ledger", local_path(ledger))
        else:
            try:
                check_folder("ledger", local_path(ledger))
            except ConfigError as exc:
                logger.error(
                    "the ledger cannot be written yet (%s); scoring goes on and its rows wait in ledger_spool %s",
                    exc,
                    spool,
                )
    check_folder("ledger_spool", spool or default_spool(ledger), default=spool is None)


def check_folder(setting: str, path: str, *, default: bool = False) -> None:
    """Refuse (ConfigError naming ``setting`` and ``path``) a local folder rewardq is to make or
    write in and cannot: something that is no folder (a file) where it or a folder above it must
    be, or the nearest folder that exists not writable. Makes nothing: a refused command leaves no
    folder behind. ``default``: ``path`` is the setting's default, not what was given."""
    named = _named(setting, path, default)
    probe = os.path.abspath(path)
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    where = "" if probe == os.path.abspath(path) else f" ({probe}, on its path)"
    if not os.path.isdir(probe):
        what = "a file" if os.path.isfile(probe) else "a link to nothing" if os.path.islink(probe) else "not a folder"
        raise ConfigError(f"{named}: {what}{where} where a folder must be; give {setting} a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{named}: the folder{where} is not writable (permission denied) for this user; "
            f"give {setting} a folder it may write in"
        )


def unusable_folder(setting: str, path: str, exc: OSError, *, default: bool = False) -> ConfigError:
    """The ConfigError of a local folder the system refused to make or write (``exc``), naming
    ``setting``, ``path`` and the system's reason: what :func:`check_folder` could not foresee
    (a read-only disk, a name too long, a folder made a file since)."""
    why = exc.strerror or str(exc)
    return ConfigError(
        f"{_named(setting, path, default)}: the folder cannot be made or written ({why}); give {setting} another folder"
    )


def _named(setting: str, path: str, default: bool) -> str:
    return f"{setting} {path}" + (" (its default)" if default else "")


def default_spool(url: str) -> str:
    """Where a worker spools for ledger ``url`` unless ``ledger_spool`` says: beside a local ledger
    (``<ledger>/_spool/<host>``), else in the user's cache folder, one folder per ledger URL."""
    host = socket.gethostname() or "host"
    if is_local(url):
        return os.path.join(local_path(url), "_spool", host)
    import hashlib

    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "rewardq", "ledger-spool", digest)
