"""The worker's write-ahead spool: ledger frames on local disk, written before each commit.

Why a spool: a ledger row must exist before the trajectory is acknowledged (else a SIGKILL
between the two loses it), but writing Parquet per trajectory would make tiny files and cost a
round trip to an object store on the hot path. So each trajectory's frame is appended to a
local segment file (one ``writev`` to the page cache, ~64 KB for a typical trajectory) before its
commit, and a background flusher turns whole segments into Parquet files
(:mod:`rewardq.ledger.sink`). A process killed at any point leaves its segments on disk; the next
worker on the host adopts and flushes them (:meth:`Spool.orphans`).

Layout of the spool folder (one per ledger and host)::

    <owner>.lock                         held with flock(LOCK_EX) by the live worker <owner>
    <owner>.<spool id>-<seq>.wal         its segments, frames appended (rewardq.ledger.frames)
    <owner>.<spool id>-<seq>.wal.unreadable
                                         a segment written but for frames it could not read, kept
                                         for an operator to look at (never read again by rewardq)

A segment's Parquet files are named after it (:func:`part_name`), so a segment written twice (its
worker died after writing the file, before deleting the segment) overwrites its own file. The
``spool id`` makes that name unique for good: 64 random bits drawn each time a worker opens its
spool, so a worker started again under the same name (whose segment numbers start at 1 again
once its spool is empty), a worker of the same name on another host, and the worker adopting a
dead one's segments never write a file another segment wrote.

A lock that can be taken belongs to a dead worker: its segments are adopted. flock is released by
the kernel when a process dies however it dies, so adoption needs no heartbeat and no clock; it
also means the spool must be on a local filesystem (flock over NFS is not dependable). A worker
that stops cleanly, and a worker done adopting a dead one's segments, delete the lock file while
holding its lock; whoever takes a lock therefore checks that the file it locked is still the one
at that name (:func:`take_lock`), else a lock taken on a deleted file would prove nothing.

What a write survives: the process's death (SIGKILL, OOM kill), since the page cache outlives it;
not a power loss, since nothing is fsynced (a torn last frame is then skipped when read back).
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewardq.ledger.frames import Part, outcome_frame, part_bytes, provenance_frame

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
#: The suffix a segment with unreadable frames gets once written (:meth:`Spool.set_aside`).
UNREADABLE = ".unreadable"
#: A segment's file name; segments spooled by rewardq before spool ids existed have none.
_SEGMENT = re.compile(r"^(?P<owner>.+)\.(?:(?P<spool>[0-9a-f]{16})-)?(?P<seq>\d{10})\.wal$")


def part_name(segment: Path) -> str:
    """The name of the Parquet files made from ``segment``: ``part-<owner>-<spool id>-<seq>``, a
    function of the segment's own name only (see the module doc)."""
    m = _SEGMENT.match(segment.name)
    if m is None:  # not named by a spool (a file an operator renamed): its own name, still its own
        return f"part-{segment.name.removesuffix('.wal')}"
    spool = f"{m['spool']}-" if m["spool"] else ""
    return f"part-{m['owner']}-{spool}{m['seq']}"


def safe_name(name: str) -> str:
    """``name`` as a file-name component (anything but letters, digits, ``_ . -`` becomes ``_``)."""
    return _SAFE.sub("_", name)[:120] or "worker"


@dataclass
class Segment:
    """One spool file being written (or sealed and waiting for its commits to settle)."""

    path: Path
    seq: int
    fd: int
    opened: float
    size: int = 0
    frames: int = 0
    unsettled: set[int] = field(default_factory=set)
    outcomes: list[bytes] = field(default_factory=list)  # outcome frames not yet written
    provenance: set[str] = field(default_factory=set)
    sealed_at: float | None = None


@dataclass
class Orphan:
    """A dead worker's segments, and the lock that proves it dead (held until :meth:`release`)."""

    owner: str
    segments: list[Path]
    lock_path: Path
    lock_fd: int | None

    def release(self, *, remove: bool) -> None:
        """Give the lock up; ``remove``: every segment is written, so drop the lock file too."""
        if self.lock_fd is None:
            return
        try:
            if remove:
                self.lock_path.unlink(missing_ok=True)
        finally:
            os.close(self.lock_fd)
            self.lock_fd = None


class Spool:
    """Append-only segment files of one worker (see the module doc).

    Args:
        directory: the spool folder (created if missing).
        owner: the worker's name (made file-safe; a random suffix is added when another live
            process holds the same name).
        segment_bytes: a segment is sealed once it holds this many bytes.
        segment_seconds: ... or once it is this old.
        settle_seconds: a sealed segment waits at most this long for the commit outcomes of its
            trajectories (their rows are then written with ``committed`` null).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        owner: str,
        *,
        segment_bytes: int,
        segment_seconds: float,
        settle_seconds: float,
    ) -> None:
        self.directory = Path(directory)
        self.owner = safe_name(owner)
        self.segment_bytes = segment_bytes
        self.segment_seconds = segment_seconds
        self.settle_seconds = settle_seconds
        self._lock_fd: int | None = None
        self._current: Segment | None = None
        self._sealed: list[Segment] = []
        self._by_ticket: dict[int, Segment] = {}
        self._next_ticket = 1
        self._next_seq = 1
        self.spool_id = ""  # drawn by open()

    # -- life ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Create the folder, take this worker's lock, and start after its own leftover segments
        (a worker restarted under the same name: they are adopted like any dead worker's)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            fd = take_lock(self.directory / f"{self.owner}.lock")
            if fd is None:  # a live process holds this name
                self.owner = f"{self.owner}-{secrets.token_hex(3)}"
                continue
            self._lock_fd = fd
            break
        else:
            raise OSError(f"cannot take a lock in the ledger spool {self.directory}")
        self.spool_id = secrets.token_hex(8)
        self._next_seq = 1
        self._own_leftovers = [p for owner, _, p in sorted(self._segments()) if owner == self.owner]

    def close(self) -> None:
        """Close every file, delete the lock file and give up the lock. Segments not yet flushed
        stay, and are adopted all the same: :meth:`orphans` finds owners by their segments too."""
        for seg in [*self._sealed, *([self._current] if self._current else [])]:
            _close(seg)
        self._sealed, self._current = [], None
        if self._lock_fd is not None:
            try:
                (self.directory / f"{self.owner}.lock").unlink(missing_ok=True)  # still held: see take_lock
            except OSError:
                pass  # left as a crash leaves it: the next adoption removes it
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- the hot path -------------------------------------------------------------------------
    def ticket(self) -> int:
        """A number for the next trajectory frame (its outcome frame refers to it)."""
        t = self._next_ticket
        self._next_ticket += 1
        return t

    def append(
        self,
        ticket: int,
        frame: bytes | Sequence[Part],
        provenance: tuple[str, Mapping[str, object]] | None = None,
    ) -> None:
        """Write one trajectory frame (bytes, or the buffers that make it, written with one
        ``writev``) and, the first time this segment sees it, its provenance blob, to the current
        segment. Raises OSError when the disk refuses it; the segment is then cut back to where it
        was, so one failed write never hides the frames after it."""
        seg = self._segment()
        parts = [frame] if isinstance(frame, (bytes, bytearray, memoryview)) else list(frame)
        if provenance is not None and provenance[0] not in seg.provenance:
            parts.insert(0, provenance_frame(*provenance))
        outcomes, seg.outcomes = seg.outcomes, []
        try:
            _write(seg, [*outcomes, *parts])
        except OSError:
            seg.outcomes[:0] = outcomes  # tried again as the segment is retired
            self._retire_current()
            raise
        if provenance is not None:
            seg.provenance.add(provenance[0])
        seg.unsettled.add(ticket)
        self._by_ticket[ticket] = seg

    def settle(self, ticket: int, committed: bool | None) -> None:
        """Record whether the commit of ``ticket``'s trajectory wrote its result. The outcome frame
        goes out with the segment's next trajectory frame (one ``writev``), or at the next
        :meth:`write_outcomes` (each ledger tick, every second) or seal, whichever comes first;
        best effort: a failed write, or a process killed before it, leaves ``committed`` unknown."""
        seg = self._by_ticket.pop(ticket, None)
        if seg is None:
            return
        seg.unsettled.discard(ticket)
        if seg.fd >= 0:
            seg.outcomes.append(outcome_frame(ticket, committed))
            if seg is not self._current:
                _write_outcomes(seg)

    def write_outcomes(self) -> None:
        """Write the outcome frames that wait for the current segment's next frame."""
        if self._current is not None:
            _write_outcomes(self._current)

    # -- for the flusher ----------------------------------------------------------------------
    def rotate_if_due(self, now: float | None = None) -> None:
        """Seal the current segment when it is big or old enough (new frames go to a new one)."""
        seg = self._current
        if seg is None or seg.frames == 0:
            return
        now = time.monotonic() if now is None else now
        if seg.size >= self.segment_bytes or now - seg.opened >= self.segment_seconds:
            self.seal()

    def seal(self) -> None:
        """Seal the current segment now (it is flushed once its commits settle)."""
        seg = self._current
        if seg is not None and seg.frames:
            _write_outcomes(seg)
            seg.sealed_at = time.monotonic()
            self._sealed.append(seg)
            self._current = None

    def ready(self, now: float | None = None, *, all_: bool = False) -> list[Path]:
        """Sealed segments whose commits have all settled (or waited ``settle_seconds``, or
        ``all_``): closed, in order, for the flusher. The files stay until :meth:`done`."""
        now = time.monotonic() if now is None else now
        out, keep = [], []
        for seg in self._sealed:
            assert seg.sealed_at is not None
            if all_ or not seg.unsettled or now - seg.sealed_at >= self.settle_seconds:
                for t in seg.unsettled:
                    self._by_ticket.pop(t, None)
                _close(seg)
                out.append(seg.path)
            else:
                keep.append(seg)
        self._sealed = keep
        return out

    def leftovers(self) -> list[Path]:
        """This owner's own segments from an earlier life (taken once)."""
        out, self._own_leftovers = getattr(self, "_own_leftovers", []), []
        return list(out)

    def orphans(self) -> Iterator[Orphan]:
        """Dead workers' segments, one owner at a time, each with its lock held until released."""
        owners: dict[str, list[Path]] = {}
        for owner, _, path in sorted(self._segments()):
            if owner != self.owner:
                owners.setdefault(owner, []).append(path)
        locks = {p.stem for p in self.directory.glob("*.lock")}
        for owner in sorted(set(owners) | (locks - {self.owner})):
            lock_path = self.directory / f"{owner}.lock"
            try:
                fd = take_lock(lock_path)
            except OSError:
                continue
            if fd is None:  # alive: not ours to take
                continue
            segments = sorted(p for o, _, p in self._segments() if o == owner)
            yield Orphan(owner, segments, lock_path, fd)

    @staticmethod
    def done(path: Path) -> None:
        """A segment is in the ledger: delete it."""
        path.unlink(missing_ok=True)

    @staticmethod
    def set_aside(path: Path) -> Path:
        """A segment is in the ledger but for frames that could not be read: keep it, renamed so
        that nothing reads it again, for an operator to look at; where it now is."""
        kept = path.with_name(path.name + UNREADABLE)
        os.replace(path, kept)
        return kept

    @property
    def unsettled(self) -> int:
        """Trajectories spooled whose commit outcome is not known yet."""
        return len(self._by_ticket)

    @property
    def sealed(self) -> int:
        """Sealed segments waiting for their commits to settle."""
        return len(self._sealed)

    def pending_bytes(self) -> int:
        """Bytes in segments not yet flushed, this worker's (files already handed out included)."""
        total = 0
        for owner, _, p in self._segments():
            if owner != self.owner:
                continue
            try:
                total += p.stat().st_size
            except OSError:
                pass
        return total

    # -- internals ------------------------------------------------------------------------------
    def _retire_current(self) -> None:
        """After a failed write: new frames go to a new segment. What this one holds stays readable
        (a torn tail, if the cut back failed, is its last frame); an empty one is removed."""
        seg = self._current
        if seg is None:
            return
        if seg.frames:
            self.seal()
            return
        _close(seg)
        seg.path.unlink(missing_ok=True)
        self._current = None

    def _segment(self) -> Segment:
        seg = self._current
        if seg is None:
            seq = self._next_seq
            self._next_seq += 1
            path = self.directory / f"{self.owner}.{self.spool_id}-{seq:010d}.wal"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            seg = self._current = Segment(path, seq, fd, time.monotonic())
        return seg

    def _segments(self) -> list[tuple[str, int, Path]]:
        out = []
        for p in self.directory.glob("*.wal"):
            m = _SEGMENT.match(p.name)
            if m:
                out.append((m["owner"], int(m["seq"]), p))
        return out


def take_lock(path: Path) -> int | None:
    """An open descriptor of lock file ``path`` (created if missing) holding its ``flock``, or None
    when another process holds it. The lock counts only if the file locked is still the one named
    ``path``: its holder may have deleted it meanwhile (a clean stop, an adoption done), and a lock
    on a deleted file excludes no one who opens the name afresh, so then it is taken again."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            named, locked = os.stat(path), os.fstat(fd)
            if (named.st_dev, named.st_ino) == (locked.st_dev, locked.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


#: Buffers passed to one ``writev`` at most (the system's IOV_MAX is 1024).
_IOV_MAX = 512


def _write(seg: Segment, parts: Sequence[Part]) -> None:
    """Append ``parts`` (one ``writev`` for a usual frame; a short write goes on where it stopped)."""
    before = seg.size
    sizes = [part_bytes(p) for p in parts]
    total = left = sum(sizes)
    views: list[Any] = [p for p, n in zip(parts, sizes) if n]  # buffers (numpy's stubs do not say so)
    try:
        while views:
            n = os.writev(seg.fd, views[:_IOV_MAX])
            if n == left:  # the usual case: all of it at once
                break
            left -= n
            views = [p if type(p) is bytes else memoryview(p).cast("B") for p in views]
            while views and n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            if n:
                views[0] = memoryview(views[0])[n:]
    except OSError:
        try:
            os.ftruncate(seg.fd, before)
        except OSError:
            pass
        raise
    seg.size = before + total
    seg.frames += 1


def _write_outcomes(seg: Segment) -> None:
    outcomes, seg.outcomes = seg.outcomes, []
    if outcomes and seg.fd >= 0:
        try:
            _write(seg, outcomes)
        except OSError:
            pass


def _close(seg: Segment) -> None:
    _write_outcomes(seg)
    if seg.fd >= 0:
        try:
            os.close(seg.fd)
        finally:
            seg.fd = -1
