"""Start a local Ray, trying again when Ray's own start-up wait runs out on a busy machine.

Ray 2.x waits a fixed 30 s for its raylet to register with the GCS (``raylet_start_wait_time_s`` in
``ray/_private/node.py``; no setting changes it) and then raises "The current node timed out during
startup". On a 2-core machine running a test suite beside it (load 30+), a node that would have come up
in 40 s fails that way. The benchmarks and the tests that start a Ray of their own start it here: a
start that ran out of time has its processes killed and is started again, in a fresh temp dir (at
most three tries); any other failure is raised at once, after the same clean-up.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.procfs import is_zombie

logger = logging.getLogger(__name__)

STARTUP_TIMED_OUT = "timed out during startup"
ATTEMPTS = 3


def init_local_ray(temp_prefix: str, temp_parent: str | None = None, **kwargs: Any) -> Path:
    """``ray.init(address="local", _temp_dir=<new dir>, **kwargs)``; returns the temp dir it used.

    The temp dir is made under ``temp_parent`` (``/tmp`` by default: Ray's socket paths have a length
    limit); the caller removes it after ``ray.shutdown()``.
    """
    import ray

    for attempt in range(1, ATTEMPTS + 1):
        temp = Path(tempfile.mkdtemp(prefix=temp_prefix, dir=temp_parent or "/tmp"))
        try:
            ray.init(address="local", _temp_dir=str(temp), **kwargs)
            return temp
        except Exception as exc:
            # The start failed inside ray's Node(), before ray.init recorded the node, so
            # ray.shutdown() does not know the GCS and raylet it started: they are found by the temp
            # dir their command lines name.
            ray.shutdown()
            kill_processes_naming(temp)
            shutil.rmtree(temp, ignore_errors=True)
            if STARTUP_TIMED_OUT not in str(exc) or attempt == ATTEMPTS:
                raise
            logger.warning("Ray's node start ran out of its 30 s (try %d of %d); starting it again", attempt, ATTEMPTS)
    raise AssertionError("unreachable")


def kill_processes_naming(path: Path, wait: float = 10.0) -> None:
    """SIGKILL every process of this user whose command line names ``path``, and wait for them to go."""
    needle = str(path).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
                pids.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    deadline = time.monotonic() + wait
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if not is_zombie(p)]
        time.sleep(0.05)
