"""The worker's ledger: each trajectory spooled before its commit, spooled segments flushed to Parquet.

:class:`Ledger` is a collaborator of the worker, as the commit coalescer is. Its guarantee:

* **Nothing acknowledged is missing.** :meth:`Ledger.scored` (and :meth:`Ledger.failed`) append
  the trajectory's frame to the local spool *before* the worker commits it; a worker killed after
  that leaves the frame on disk, and the next worker on the host adopts and flushes it
  (:mod:`rewardq.ledger.spool`). Redis plays no part, so a Redis restart cannot lose a row either.
* **At least once.** A trajectory spooled and then scored again elsewhere (its worker died before
  the commit) has a row per attempt; readers keep one per key (:mod:`rewardq.ledger.read`).
* **Never in scoring's way.** A spool write that fails (disk full) is counted and logged, and the
  trajectory is committed all the same; a destination that refuses files (bucket gone, no
  permission) leaves the segments on local disk, retried with backoff, up to
  ``ledger_spool_max_bytes``, past which trajectories are counted as not written. Both show in
  the heartbeat (``rewardq status``/``top``), the metrics and the log, every minute while they last.
  So do spooled frames the flusher could not read back (damaged on disk, of a kind a newer
  rewardq wrote, or with a field missing or wrong): counted as ``unreadable``, logged once per
  segment with the reasons, the segment kept aside; its other frames are written as usual.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rewardq.backoff import compute_backoff
from rewardq.ledger.flusher import Flusher, FlushError, flusher_for
from rewardq.ledger.frames import TrajectoryFacts, part_bytes, stub_record, trajectory_parts
from rewardq.ledger.results import ERROR_COLUMNS
from rewardq.ledger.spool import Orphan, Spool
from rewardq.ledger.store import LedgerStore, default_spool, unusable_folder
from rewardq.queue.codec import OutputRecord
from rewardq.queue.keys import trajectory_id

logger = logging.getLogger("rewardq.ledger")

#: Seconds between two loud log lines about the same ledger failure.
_LOG_EVERY = 60.0
#: How often the background loop looks at the spool, at most (seconds).
_TICK = 1.0
#: Seconds between two looks for dead workers' segments.
_ADOPT_EVERY = 60.0
#: The longest pause between two tries to write to a failing destination (seconds).
_BACKOFF_CAP = 60.0

Provenance = tuple[str, Mapping[str, Any]]


def require_writer() -> None:
    """Raise MissingExtra (exit 2) when pyarrow or fsspec, the ``ledger`` extra, is missing.

    Found, not imported: the worker itself never imports pyarrow (its flusher process does,
    :mod:`rewardq.ledger.flusher`)."""
    from importlib.util import find_spec

    from rewardq.errors import ConfigError

    for module in ("pyarrow", "fsspec"):
        if find_spec(module) is None:
            raise ConfigError(
                f"the ledger needs {module} (missing here): pip install 'rewardq[ledger]' where the worker runs, "
                "or start it without --ledger"
            )


class Ledger:
    """One worker's ledger writer (see the module doc).

    Args:
        url: the ledger: a local folder or an fsspec URL.
        worker: the worker's name (the spool's owner, and in file names).
        spool: the spool folder (default: :func:`~rewardq.ledger.store.default_spool`).
        flush_interval: seconds a spool segment collects before it is written as Parquet.
        file_bytes: ... or bytes (whichever comes first).
        spool_max_bytes: spooled bytes not yet written past which new trajectories are not spooled
            (counted as unwritten) rather than fill the disk.
        flusher_process: write Parquet in a flusher process beside the worker (default), not in a
            thread of it (:mod:`rewardq.ledger.flusher`).
    """

    def __init__(
        self,
        url: str,
        *,
        worker: str,
        spool: str | None = None,
        flush_interval: float,
        file_bytes: int,
        spool_max_bytes: int,
        flusher_process: bool = True,
    ) -> None:
        self.url = url
        self.worker = worker
        self.spool_dir = spool or default_spool(url)
        self._spool_default = not spool
        self.flush_interval = flush_interval
        self.spool_max_bytes = spool_max_bytes
        self.spool = Spool(
            self.spool_dir,
            worker,
            segment_bytes=file_bytes,
            segment_seconds=flush_interval,
            settle_seconds=max(30.0, 2 * flush_interval),
        )
        self.flusher_process = flusher_process
        self.flusher: Flusher | None = None
        self.counts = {
            "spooled": 0,  # trajectories spooled
            "unwritten": 0,  # trajectories that could not be spooled: not in the ledger
            # keys no row can hold by design (an index past the int32 column, a trajectory with no
            # readable record): not a failure of the destination (docs/ledger.md)
            "refused": 0,
            "rows": 0,  # rows written to the ledger
            "files": 0,
            "segments": 0,  # spool segments written (this worker's and adopted ones)
            "adopted": 0,  # dead workers' segments written
            "errors": 0,  # failed writes (spool or destination)
            "unreadable": 0,  # spooled frames the flusher could not read: not in the ledger
        }
        self.last_error = ""
        self._lost_at = 0.0  # when a trajectory last could not be spooled
        self._last_logged = 0.0
        self._failures = 0  # destination writes failed in a row
        self._retry_at = 0.0
        self._pending: list[Path] = []  # sealed segments not yet written
        self._spooled_bytes = 0  # written to the spool and not yet flushed (this worker's)
        self._closing = False
        self._last_adopt = -_ADOPT_EVERY
        self._writing = threading.Lock()  # one flusher thread at a time (a stop's flush may follow a cancelled one)

    # -- life -----------------------------------------------------------------------------------
    def open(self) -> None:
        """Open the spool and the destination (raises what makes the ledger unusable: a spool
        folder the system refuses as a ConfigError naming the setting)."""
        try:
            self.spool.open()
        except OSError as exc:
            raise unusable_folder("ledger_spool", self.spool_dir, exc, default=self._spool_default) from exc
        LedgerStore(self.url)  # a URL no filesystem serves fails here, at start-up
        self.flusher = flusher_for(self.url, process=self.flusher_process)
        leftovers = self.spool.leftovers()  # an earlier life's: not yet written, so counted as spooled
        self._pending.extend(leftovers)
        self._spooled_bytes += sum(map(_size, leftovers))
        logger.info("ledger: %s (spool %s, flushed every %gs)", self.url, self.spool_dir, self.flush_interval)

    async def run(self) -> None:
        """Seal, flush and adopt segments until cancelled (the worker runs it as a background task)."""
        while True:
            await asyncio.sleep(_TICK)
            try:
                await self.flush_due()
            except Exception as exc:  # noqa: BLE001 - one failure must not end the loop: its segments would wait for ever
                # counted as a failed write (state "failing", backed off), as a FlushError is: only
                # its kind is unforeseen
                self._failed(f"flushing failed: {type(exc).__name__}: {exc}")

    async def flush_due(self, *, everything: bool = False) -> None:
        """Write the segments that are due, and every ``_ADOPT_EVERY`` s dead workers' segments
        (``everything``: the current segment too, without waiting for outcomes, and dead workers'
        segments now: a stopping worker leaves nothing behind it can write)."""
        self.spool.write_outcomes()
        if everything:
            self.spool.seal()
        else:
            self.spool.rotate_if_due()
        self._pending.extend(self.spool.ready(all_=everything))
        now = time.monotonic()
        if now < self._retry_at and not everything:
            return
        adopt = everything or now - self._last_adopt >= _ADOPT_EVERY
        if adopt:
            self._last_adopt = now
        if self._pending or adopt:
            await asyncio.to_thread(self._write_pending, adopt)

    async def close(self, timeout: float) -> None:
        """Write what is spooled (within ``timeout`` seconds; what is left stays in the spool for the
        next worker on this host), then close the spool."""
        self._closing = True
        late = False
        try:
            await asyncio.wait_for(self.flush_due(everything=True), timeout)
        except asyncio.TimeoutError:
            late = True
            logger.warning(
                "ledger: could not write every spooled segment within %gs; the next worker on this host writes them",
                timeout,
            )
        except Exception as exc:  # noqa: BLE001 - a failing ledger never fails the worker's stop
            self._error(f"final flush failed: {exc}")
        finally:
            self.spool.close()
            if self.flusher is not None and late:  # the segment it writes is stopped: written again later
                self.flusher.close(wait=0.0)
            elif self.flusher is not None:
                self.flusher.close()

    # -- the hot path ---------------------------------------------------------------------------
    def scored(self, facts: TrajectoryFacts, blob: Mapping[str, object]) -> int | None:
        """Spool one trajectory before its commit (``blob``: its provenance blob, named by
        ``facts.provenance``); returns its ticket for :meth:`settle` (None when it could not be
        spooled: counted, logged, and the commit goes ahead)."""
        if self._spooled_bytes >= self.spool_max_bytes:
            self.counts["unwritten"] += 1
            self._lost_at = time.time()
            self._error(
                f"the spool holds {self._spooled_bytes:,} bytes not yet written (ledger_spool_max_bytes="
                f"{self.spool_max_bytes:,}): trajectories are scored but not kept until the ledger accepts "
                f"writes again ({self.last_error or 'see earlier errors'})"
            )
            return None
        spool = self.spool
        ticket = spool.ticket()
        try:
            parts = trajectory_parts(ticket, facts)
            spool.append(ticket, parts, (facts.provenance, blob) if facts.provenance else None)
        except Exception as exc:  # noqa: BLE001 - the disk, or a value msgpack refused: the commit goes on
            self.counts["unwritten"] += 1
            self._lost_at = time.time()
            first = facts.records[0]
            tid = trajectory_id(first.uid, first.session_id)
            self._error(f"could not spool trajectory {tid}: {type(exc).__name__}: {exc}")
            return None
        self.counts["spooled"] += 1
        self._spooled_bytes += sum(map(part_bytes, parts))
        return ticket

    def failed(
        self,
        uid: str,
        session_id: str,
        outputs: int | Sequence[OutputRecord],
        sample: Mapping[str, object],
        reason: str,
        *,
        failure_kind: str | None,
        manager: str,
        attempt: int,
        put_ts: float,
        provenance: Provenance | None,
        latency_ms: float | None = None,
        response: str | None = None,
        score_ms: float | None = None,
    ) -> int | None:
        """Spool a trajectory that ends with an error result for every key, before that result is
        written. ``outputs``: its records when they decoded, else how many outputs it has (its rows
        then carry no ids); ``provenance``: what its error results name (None: nothing scored it);
        ``latency_ms``: the error result's (default: from ``put_ts`` to now, as the ``fail``
        script measures it; none without a ``put_ts``); ``response``, ``score_ms``: the decoded
        final response and the manager's time, when it ran and raised."""
        records = outputs if not isinstance(outputs, int) else _stub_records(uid, session_id, outputs)
        if not records:
            return None
        now = time.time()
        if latency_ms is None and put_ts > 0:
            latency_ms = max(0.0, now - put_ts) * 1000.0
        row = error_row(
            reason,
            failure_kind=failure_kind,
            worker=self.worker,
            manager=manager,
            scored_at=now,
            latency_ms=latency_ms,
        )
        digest, blob = provenance if provenance is not None else ("", {})
        facts = TrajectoryFacts(
            records, sample, ERROR_COLUMNS, [row], attempt, put_ts, score_ms, digest, response=response
        )
        return self.scored(facts, blob)

    def settle(self, ticket: int | None, committed: bool | None) -> None:
        """The commit of a spooled trajectory ended: ``committed`` True when it wrote the result,
        False when the trajectory was already finished (another attempt's result stands), None
        when it failed (the entries stay pending and are scored again)."""
        if ticket is not None:
            self.spool.settle(ticket, committed)

    # -- status ---------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """What the heartbeat publishes: counters, what waits, and the last error."""
        # failing: the destination refuses files now, or a trajectory could not be spooled lately
        failing = self._failures > 0 or (self._lost_at and time.time() - self._lost_at < 2 * _LOG_EVERY)
        return {
            **self.counts,
            "state": "failing" if failing else "ok",
            "pending_segments": len(self._pending) + self.spool.sealed,
            "pending_bytes": self._spooled_bytes,
            "last_error": self.last_error[:300],
            "url": self.url,
        }

    # -- the flusher thread ---------------------------------------------------------------------
    def _write_pending(self, adopt: bool) -> None:
        """Write pending segments in order, then (``adopt``) dead workers'; stop at the first failure."""
        with self._writing:
            self._write_pending_locked(adopt)

    def _write_pending_locked(self, adopt: bool) -> None:
        while self._pending:
            path = self._pending[0]
            size = _size(path)
            if not self._write_segment(path):
                return
            self._pending.pop(0)
            self._spooled_bytes = max(0, self._spooled_bytes - size)
        if adopt:
            for orphan in self.spool.orphans():
                if not self._adopt(orphan):
                    return

    def _adopt(self, orphan: Orphan) -> bool:
        try:
            for path in orphan.segments:
                if not self._write_segment(path):
                    orphan.release(remove=False)
                    return False
                self.counts["adopted"] += 1
        except BaseException:
            orphan.release(remove=False)  # held, its lock would say its dead owner lives: never adopted again
            raise
        orphan.release(remove=True)
        if orphan.segments:
            logger.info("ledger: wrote %d segment(s) left by worker %s", len(orphan.segments), orphan.owner)
        return True

    def _write_segment(self, path: Path) -> bool:
        """One segment to Parquet by the flusher (:mod:`rewardq.ledger.flusher`); False on failure."""
        assert self.flusher is not None
        try:
            written = self.flusher.write(path)
        except FlushError as exc:
            return self._failed(str(exc))
        if written is not None:
            self.counts["rows"] += written.rows
            self.counts["files"] += written.files
            self.counts["segments"] += 1
            if written.skipped.frames:
                self.counts["unreadable"] += written.skipped.frames
                logger.warning(
                    "ledger: spool segment %s: %s; its other frames are written, the segment is kept as %s",
                    path,
                    written.skipped,
                    written.kept,
                )
            elif written.skipped.no_provenance:
                logger.warning("ledger: spool segment %s: %s", path, written.skipped)
        if self._failures:
            logger.warning("ledger: writing to %s again after %d failed tries", self.url, self._failures)
        self._failures = 0
        self._retry_at = 0.0
        return True

    def _failed(self, why: str) -> bool:
        self._failures += 1
        self._retry_at = time.monotonic() + compute_backoff(self._failures, base=1.0, cap=_BACKOFF_CAP)
        self._error(
            f"{why}; spooled segments stay in {self.spool_dir} and are retried "
            f"({len(self._pending)} waiting, {self._spooled_bytes:,} bytes)"
        )
        return False

    def _error(self, message: str) -> None:
        """Count and remember an error; log it loudly, once a minute at most."""
        self.counts["errors"] += 1
        self.last_error = message
        now = time.monotonic()
        if now - self._last_logged >= _LOG_EVERY or self._closing:
            self._last_logged = now
            logger.error("ledger: %s", message)


def error_row(
    reason: str,
    *,
    failure_kind: str | None,
    worker: str,
    manager: str,
    scored_at: float,
    latency_ms: float | None,
) -> list[bytes]:
    """The values of an error result for the ledger, in :data:`~rewardq.ledger.table.ERROR_COLUMNS`
    order (named here, so a column the table adds without a value here fails at once)."""
    values = {
        "status": b"error",
        "reward_score": b"",
        "reward_extra_info": json.dumps({"error": reason}, ensure_ascii=False).encode(),
        "error": reason.encode("utf-8", "replace"),
        "failure_kind": (failure_kind or "").encode(),
        "worker": worker.encode("utf-8", "replace"),
        "manager": manager.encode("utf-8", "replace"),
        "scored_at": f"{scored_at:.6f}".encode(),
        "latency_ms": b"" if latency_ms is None else f"{latency_ms:.3f}".encode(),
    }
    return [values[c] for c in ERROR_COLUMNS]


def _stub_records(uid: str, session_id: str, n: int) -> list[OutputRecord]:
    """Rows for the keys of a trajectory whose records could not be read: identity only."""
    return [stub_record(uid, session_id, i, final=i == n - 1) for i in range(max(0, n))]


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
