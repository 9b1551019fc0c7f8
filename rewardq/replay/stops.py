"""How ``rewardq replay`` takes SIGINT (Ctrl-C) and SIGTERM: every stop ends the same clean way.

One handler serves the whole command, so no signal finds Python's default behaviour (SIGTERM
killing the process before it deletes its namespace, a second Ctrl-C cancelling a worker that is
already stopping, cancelling it halfway through writing the ledger). The first signal:

* while the ledger is read and the worker prepared (nothing started yet): raises
  :class:`KeyboardInterrupt` there, which the command turns into an interrupted summary;
* while the replay runs: sets its ``interrupt`` event (thread-safe: the event loop wakes at
  once), and the worker finishes and writes what it holds;
* once the replay ended (deleting its namespace, printing the summary): only noted.

Later signals are noted and ignored: the stop under way finishes. :attr:`Stops.received` says
whether any came, for the summary's ``interrupted``.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stops:
    """The command's SIGINT/SIGTERM handler (module doc); a context manager that installs it and puts
    the previous handlers back."""

    def __init__(self) -> None:
        self.received: str | None = None  # the first signal's name
        self._raise = False
        self._interrupt: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Stops:
        for sig in _SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @contextmanager
    def raising(self) -> Iterator[None]:
        """While inside: the first signal raises KeyboardInterrupt (one received before: at once)."""
        if self.received:
            raise KeyboardInterrupt
        self._raise = True
        try:
            yield
        finally:
            self._raise = False

    @contextmanager
    def interrupting(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Iterator[None]:
        """While inside: the first signal sets ``event`` (one received before: at once)."""
        if self.received:
            event.set()
        self._interrupt = (loop, event)
        try:
            yield
        finally:
            self._interrupt = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # a later signal: the stop under way finishes
            return
        self.received = signal.Signals(signum).name
        if self._raise:
            raise KeyboardInterrupt
        if self._interrupt is not None:
            loop, event = self._interrupt
            loop.call_soon_threadsafe(event.set)
