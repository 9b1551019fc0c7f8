"""A scorer process's stdout and stderr reach the worker's log capped, per call.

A scorer process inherits the worker's stdout and stderr, so whatever a reward function prints
lands in the worker's log: 100 MB of it would bury the log (and fill its disk). So
:class:`CappedOutput` points file descriptors 1 and 2 of the scorer process (and so of anything
it forks) at pipes, and a thread of the process forwards each pipe to the original descriptor:
the first ``cap`` bytes of each per call, counting and dropping the rest. After a call,
:meth:`CappedOutput.end_call` waits until the thread has read all that the call wrote and says,
per stream, how much was written and dropped; the pool logs the drop as a warning naming the
process, so a cut is never silent.

The thread only moves bytes (``os.read``/``os.write`` release the GIL); the call's own writes
block only while a pipe is full, as they would on a slow terminal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import struct
import sys
import termios
import threading
from dataclasses import dataclass

#: Seconds a scorer process waits, after a call, for its output thread to read what the call wrote.
SCORER_OUTPUT_DRAIN = 1.0


_CHUNK = 64 * 1024


@dataclass
class StreamCount:
    """One stream's bytes during one call: ``written`` by the call, ``dropped`` of them."""

    name: str
    written: int = 0
    dropped: int = 0


class CappedOutput:
    """Route fds 1 and 2 through pipes, forwarding at most ``cap`` bytes of each per call."""

    def __init__(self, cap: int) -> None:
        self.cap = max(0, int(cap))
        self._lock = threading.Lock()
        self._counts: dict[int, StreamCount] = {}
        self._targets: dict[int, int] = {}  # pipe read end -> the original descriptor
        for fd, name in ((1, "stdout"), (2, "stderr")):
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            try:
                target = os.dup(fd)
            except OSError:  # not open in this process: nothing reaches a log from it anyway
                continue
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            self._targets[read_end] = target
            self._counts[read_end] = StreamCount(name)
        self._ctl_r, self._ctl_w = os.pipe()
        self._busy = False  # the thread has read bytes it has not counted yet
        self._epoch = threading.Event()
        self._taken: list[StreamCount] = []
        self._thread = threading.Thread(target=self._pump, name="rewardq-scorer-output", daemon=True)
        self._thread.start()

    def end_call(self, wait: float = SCORER_OUTPUT_DRAIN) -> list[StreamCount]:
        """What the call that just ended wrote to each stream (after flushing Python's buffers),
        once the thread has read it all (or ``wait`` seconds have passed); counters start again."""
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.flush()
        if not any(_pending(fd) for fd in self._targets) and not self._busy:
            with self._lock:  # everything written was read and counted (the usual case: no round trip)
                return self._take()
        self._epoch.clear()
        os.write(self._ctl_w, b".")
        if not self._epoch.wait(wait):
            with self._lock:  # something keeps writing: count what was read so far
                return self._take()
        with self._lock:
            return list(self._taken)

    def _take(self) -> list[StreamCount]:
        taken = [StreamCount(c.name, c.written, c.dropped) for c in self._counts.values()]
        for c in self._counts.values():
            c.written = c.dropped = 0
        return taken

    def _pump(self) -> None:
        sel = selectors.DefaultSelector()
        for read_end in self._targets:
            sel.register(read_end, selectors.EVENT_READ)
        sel.register(self._ctl_r, selectors.EVENT_READ)
        while True:
            ready = [key.fd for key, _ in sel.select()]
            data_ready = [fd for fd in ready if fd != self._ctl_r]
            self._busy = True  # before the read: end_call's fast path must not count too early
            for fd in data_ready:
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    sel.unregister(fd)
                    continue
                self._forward(fd, chunk)
            self._busy = False
            if self._ctl_r in ready and not data_ready and not any(_pending(fd) for fd in self._targets):
                os.read(self._ctl_r, 1)
                with self._lock:
                    self._taken = self._take()
                self._epoch.set()

    def _forward(self, fd: int, chunk: bytes) -> None:
        with self._lock:
            count = self._counts[fd]
            room = max(0, self.cap - count.written)
            count.written += len(chunk)
            keep = chunk[:room]
            count.dropped += len(chunk) - len(keep)
        view = memoryview(keep)
        while view:
            try:
                view = view[os.write(self._targets[fd], view) :]
            except OSError:  # the log is gone: nothing to forward to
                return


def describe_cut(stream: str, written: int, dropped: int, loading: bool = False) -> str:
    """The log line for output cut from one call (or from loading the function)."""
    return (
        f"the reward function wrote {written} bytes to {stream} {'while loading' if loading else 'in one call'}; "
        f"the first {written - dropped} are in the log, {dropped} were dropped (a scorer process's output is "
        "capped per stream per call)"
    )


def _pending(fd: int) -> int:
    """Bytes waiting in pipe ``fd``."""
    try:
        buf = fcntl.ioctl(fd, termios.FIONREAD, struct.pack("i", 0))
    except OSError:
        return 0
    return int(struct.unpack("i", buf)[0])
