"""Spool segments to Parquet files, in a process of its own beside the worker.

Turning a segment into Parquet (reading it back, decoding its frames, building the columns,
encoding and writing the file) is CPU work in Python and Arrow, ~0.2-0.3 ms per trajectory. Done
in a thread of the worker, it holds the GIL the worker's event loop needs: the worker drained
~30 % fewer trajectories per second and paid more per trajectory (docs/performance.md). So a
worker's :class:`~rewardq.ledger.sink.Ledger` hands each segment to a flusher process
(:class:`ProcessFlusher`: ``python -m rewardq.ledger.flusher URL``) and waits for its answer in a
thread that holds no lock meanwhile.

The protocol is one JSON line each way per segment: ``{"path"}`` in, and
``{"rows", "files", "skipped", "kept"}`` (written, the segment deleted, or kept aside when frames of it
could not be read: :class:`~rewardq.ledger.frames.Skipped`), ``{"gone": true}`` (deleted meanwhile:
another worker adopted it) or ``{"error"}`` out. The process ignores SIGINT and SIGTERM (a Ctrl-C
reaches the whole process group: the worker's last flush still needs it) and exits when its
stdin closes, which its worker's death does too. Crash safety does not depend on it: a segment
is deleted only once its files are written, and a segment written twice overwrites its own files
(their names come from the segment's: :func:`~rewardq.ledger.spool.part_name`).

A ledger on a filesystem that lives in one process's memory (fsspec's ``memory://``) is written
in the worker's thread instead (:class:`ThreadFlusher`), as the flusher process could not share it.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any, NamedTuple, Protocol

from rewardq.ledger.checks import WrongFrame
from rewardq.ledger.columns import Buffers
from rewardq.ledger.frames import SegmentFile, Skipped
from rewardq.ledger.spool import Spool, part_name
from rewardq.ledger.store import LedgerFile, LedgerStore
from rewardq.ledger.table import Partition, SegmentRows, is_trajectory

#: Seconds a closing worker waits for its flusher process to exit before killing it.
_EXIT_WAIT = 5.0


class FlushError(Exception):
    """A segment could not be written (the message says what failed); it stays in the spool."""


class Written(NamedTuple):
    """A segment written: its rows and files, what of it could not be read, and where the segment
    was kept when something could not (else it is deleted)."""

    rows: int
    files: int
    skipped: Skipped
    kept: str | None = None


class Flusher(Protocol):
    def write(self, path: Path) -> Written | None:
        """Write spool segment ``path`` and delete it (or keep it aside, when
        frames of it could not be read), or None when the segment was gone already. Raises
        :class:`FlushError`."""

    def close(self, wait: float = ...) -> None:
        """Stop writing: a segment being written gets ``wait`` seconds to finish."""


#: Bytes of ids a partition collects before they are written as a row group: what bounds the
#: flusher's memory, whatever the segment's size (docs/performance.md).
ROW_GROUP_BYTES = 16 << 20
#: Buffers the flusher copies ids into, kept from row group to row group and segment to segment;
#: a column's holds a row group's ids and the trajectory that passed the mark.
_BUFFERS = Buffers(2 * ROW_GROUP_BYTES)
#: One segment at a time per process: the buffers above (and the frames' read buffer) are shared
#: by every ledger of a process that writes in threads (:class:`ThreadFlusher`).
_ONE_AT_A_TIME = threading.Lock()


def write_segment(store: LedgerStore, path: Path) -> Written | None:
    """One segment to Parquet (one file per hour it spans, named after the segment), then deleted,
    or renamed aside (:meth:`~rewardq.ledger.spool.Spool.set_aside`) when frames of it could not be
    read (a torn last frame alone is not: it held nothing acknowledged).

    The segment is read in pieces, twice: first its frames' maps (the commit outcomes and
    provenance blobs a row needs may come after its trajectory), then each trajectory's records
    as its rows are built; every :data:`ROW_GROUP_BYTES` of ids a partition's rows are written
    as a row group of its file."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return None  # written and deleted meanwhile (another worker adopted it)
    except OSError as exc:
        raise FlushError(f"cannot read spool segment {path}: {exc}") from None
    try:
        with f, _ONE_AT_A_TIME:
            written = _write_frames(store, SegmentFile(f), part_name(path))
    except Exception as exc:  # noqa: BLE001 - the destination's failure, whatever its library raises
        raise FlushError(f"cannot write {path.name} to {store.url}: {type(exc).__name__}: {exc}") from None
    if not written.skipped.frames:
        Spool.done(path)
        return written
    try:
        return written._replace(kept=str(Spool.set_aside(path)))
    except FileNotFoundError:
        return None  # written and deleted meanwhile (another worker adopted it, and counted it)
    except OSError as exc:
        raise FlushError(f"cannot set aside spool segment {path} (frames of it unreadable): {exc}") from None


def _write_frames(store: LedgerStore, segment: SegmentFile, name: str) -> Written:
    """The trajectories of ``segment`` as files ``name`` of ``store``, and what was skipped: a frame
    that cannot become rows (:class:`~rewardq.ledger.frames.Skipped`) is counted with its reason
    and costs the other frames nothing; what the filesystem or the destination raises, raises."""
    skipped = Skipped()
    outcomes: dict[int, bool | None] = {}
    blobs: dict[str, Mapping[str, Any]] = {}
    trajectories = _scan(segment, outcomes, blobs, skipped)
    built = SegmentRows(outcomes, blobs, _BUFFERS)
    with ExitStack() as files:
        opened: dict[Partition, LedgerFile] = {}
        rows = 0

        def write(key: Partition) -> int:
            table = built.take(key)
            if table is None:
                return 0
            if key not in opened:
                opened[key] = files.enter_context(store.open(*key, name))
            opened[key].write(table)
            return int(table.num_rows)

        for i, (frame, start, raw) in enumerate(trajectories):
            trajectories[i] = _DONE  # its ids are views of a buffer the next frame reuses
            try:
                if not segment.complete(frame, start, raw):
                    skipped.damaged += 1
                    continue
                key = built.add(frame)
            except WrongFrame as exc:
                skipped.count(exc)
                continue
            if frame.get("pv") and frame["pv"] not in blobs:
                skipped.no_provenance += 1
            if built.id_bytes(key) >= ROW_GROUP_BYTES:
                rows += write(key)
        for key in sorted(built.parts):
            rows += write(key)
    return Written(rows, len(opened), skipped)


def _scan(
    segment: SegmentFile, outcomes: dict[int, bool | None], blobs: dict[str, Mapping[str, Any]], skipped: Skipped
) -> list[tuple[dict[str, Any], int, int]]:
    """The first pass over ``segment``: the trajectory frames' maps, where their bodies are, the
    commit outcomes and provenance blobs (into ``outcomes`` and ``blobs``), and what is skipped."""
    trajectories: list[tuple[dict[str, Any], int, int]] = []
    tickets: set[object] = set()  # of every frame an outcome may name
    for frame, start, raw in segment.frames():
        try:
            kind = is_trajectory(frame, outcomes, blobs)
        except WrongFrame as exc:
            skipped.count(exc)
            continue
        if kind is False:
            continue
        if kind:
            trajectories.append((frame, start, raw))
        else:
            skipped.unknown += 1
        if type(ticket := frame.get("tk")) is int:
            tickets.add(ticket)
    skipped.unreadable_bytes, skipped.torn_bytes = segment.unreadable, segment.torn
    for _ in range(len(outcomes.keys() - tickets)):
        skipped.count(WrongFrame("commit outcome", "tk", "names no trajectory of its segment"))
    return trajectories


_DONE: tuple[dict[str, Any], int, int] = ({}, 0, 0)


def warm_up() -> None:
    """Build and write one small table in memory, so Arrow's one-time set-up (its compute kernels,
    ~40 ms of CPU for the first ``take``; the Parquet writer's) happens at start-up, not in the
    first flush."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"a": pa.array(["x"]).take(pa.array([0, 0], type=pa.int32())), "b": pa.array([b"", b""])})
    pq.write_table(table, pa.BufferOutputStream(), compression="zstd")


class ThreadFlusher:
    """Writes segments in the calling thread (process-local filesystems, and tests)."""

    def __init__(self, url: str) -> None:
        self.store = LedgerStore(url)
        warm_up()

    def write(self, path: Path) -> Written | None:
        return write_segment(self.store, path)

    def close(self, wait: float = 0.0) -> None:
        pass


class ProcessFlusher:
    """Writes segments in a flusher process (see the module doc), started now and again after it died."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rewardq.ledger.flusher", self.url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,  # the spool's locks stay the worker's alone: a dead worker's are free
        )
        self._proc = proc
        return proc

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def write(self, path: Path) -> Written | None:
        """As :meth:`Flusher.write`; a flusher process found dead is started again and asked once
        more (writing a segment twice gives the same files)."""
        with self._lock:
            line = self._ask(path) or self._ask(path)
            if not line:
                raise FlushError("the ledger's flusher process ended twice writing this segment; tried again later")
            try:
                answer = json.loads(line)
                if "error" in answer:
                    raise FlushError(str(answer["error"]))
                if answer.get("gone"):
                    return None
                return Written(int(answer["rows"]), int(answer["files"]), Skipped.of(answer["skipped"]), answer["kept"])
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                # something else wrote to its stdout: the answers after it would be out of step, so
                # the process is stopped (the next segment starts another)
                proc = self._proc
                if proc is not None:
                    self._stop(proc)
                    if proc.stdout is not None:
                        proc.stdout.close()
                raise FlushError(
                    f"the ledger's flusher process answered what this worker cannot read ({line[:200]!r}: "
                    f"{type(exc).__name__}); it is started again"
                ) from None

    def _ask(self, path: Path) -> bytes:
        """One request and its answer line (empty when the process ended: it is then stopped)."""
        if self._closed:
            return b""
        try:
            proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
        except OSError as exc:  # EAGAIN, ENOMEM, EMFILE: a failed write like any other, retried later
            raise FlushError(f"the ledger's flusher process could not be started: {exc}") from None
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({"path": str(path)}).encode() + b"\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (OSError, ValueError):  # ValueError: closed meanwhile by close()
            line = b""
        if not line:
            self._stop(proc)
            proc.stdout.close()
        return line

    def close(self, wait: float = _EXIT_WAIT) -> None:
        """Stop the process (no lock taken: a thread still waiting for it gets an end of file, and
        starts no other)."""
        self._closed = True
        proc = self._proc
        if proc is not None:
            self._stop(proc, wait)
            if self._lock.acquire(blocking=False):  # else the thread reading it closes it on its end of file
                try:
                    if proc.stdout is not None:
                        proc.stdout.close()
                finally:
                    self._lock.release()

    def _stop(self, proc: subprocess.Popen[bytes], wait: float = _EXIT_WAIT) -> None:
        """Close its stdin (it exits once the segment it writes is done), wait ``wait`` s, else kill it."""
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(wait)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        if self._proc is proc:
            self._proc = None


def flusher_for(url: str, *, process: bool) -> Flusher:
    """A process flusher for ``url``, unless ``process`` is False or its filesystem is process-local."""
    if process and not url.startswith("memory://"):
        return ProcessFlusher(url)
    return ThreadFlusher(url)


def serve(url: str, requests: IO[bytes], answers: IO[bytes]) -> None:
    """The flusher process: one answer line per request line until ``requests`` ends."""
    store = LedgerStore(url)
    warm_up()
    # what start-up left (pyarrow, numpy: ~70,000 objects) never becomes garbage: keep it out of
    # the collections a segment's frames set off
    gc.freeze()
    for line in requests:
        req = json.loads(line)
        try:
            done = write_segment(store, Path(req["path"]))
            answer: dict[str, object] = {"gone": True}
            if done is not None:
                answer = {**done._asdict(), "skipped": dataclasses.asdict(done.skipped)}
        except FlushError as exc:
            answer = {"error": str(exc)}
        try:
            answers.write(json.dumps(answer).encode() + b"\n")
            answers.flush()
        except OSError:  # the worker is gone; the segment is written and deleted all the same
            return


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when to stop: its stdin closing
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(sys.argv[1], sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
