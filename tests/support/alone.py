"""Run a test while no other test of the same xdist run runs: a readers-writer lock on two files.

Every test holds the run's lock shared while it runs (setup, call, teardown); a test marked
``alone`` holds it exclusively, so it starts once the tests running on the other workers have
finished, and no test starts beside it. A test that compares Redis's answers under its own load with
an idle control on the same machine (``tests.support.ping_sampler``) needs that: another worker's
test would load the machine in one of its phases and not the other.

The turnstile keeps an ``alone`` test from waiting forever behind a stream of shared holders: it
takes the turnstile first and keeps it while it waits and runs, and every test passes through the
turnstile before it takes the shared lock. ``flock`` locks belong to the open file, so a crashed
worker's locks go with its process.
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def _flocked(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def run_lock(folder: Path, *, alone: bool) -> Iterator[None]:
    """Hold the run's lock in ``folder`` (shared by every worker of the run): exclusive if ``alone``."""
    turnstile, room = folder / "alone-turnstile.lock", folder / "alone-room.lock"
    if alone:
        with _flocked(turnstile, fcntl.LOCK_EX), _flocked(room, fcntl.LOCK_EX):
            yield
        return
    with _flocked(turnstile, fcntl.LOCK_EX):
        pass
    with _flocked(room, fcntl.LOCK_SH):
        yield


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold the machine-wide lock ``name`` (a file in the temp folder) exclusively, across test runs."""
    with _flocked(Path(tempfile.gettempdir()) / f"rewardq-tests-{name}.lock", fcntl.LOCK_EX):
        yield
