"""A ``rewardq worker`` waiting for a Redis that is not there (``--connect-timeout`` left at its
default: for ever) stops at once on SIGTERM and on one Ctrl-C (SIGINT), logging that it stops:
whether it is pausing between attempts (nothing listens on the port) or inside an attempt that
hangs (a server that accepts the connection and never answers). Real worker processes.

Each retry after the first logs one short line; the hint of what to try is logged once.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.cli_procs import Procs, wait_for, worker_argv

pytestmark = pytest.mark.slow

HINT = "Is the server running and reachable from here?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a PING there hangs until its timeout)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield int(server.getsockname()[1])
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    server.close()


def _stop_and_time(procs: Procs, url: str, sig: signal.Signals, after: str) -> tuple[float, str]:
    """Start a worker on ``url``, wait for ``after`` in its log, send ``sig``: (seconds to exit, log)."""
    w = procs.start(worker_argv(url, "t-unreachable", "w-unreachable"), tag="w")
    wait_for(lambda: after in w.stderr(), 180, after, procs=[w])
    time.sleep(0.3)  # well inside the pause or the hanging attempt
    t0 = time.monotonic()
    w.popen.send_signal(sig)
    rc = w.wait(timeout=30)  # before the fix: never (only SIGKILL ended it)
    took = time.monotonic() - t0
    log = w.stderr()
    print(f"\n[wait-for-redis] {sig.name} while waiting ({after!r}): exited {rc} after {took:.2f}s")
    assert rc == 0, log
    assert f"{sig.name} received while waiting for Redis" in log and "stopping" in log, log
    assert "start-up: connecting to Redis" in log and "connecting to Redis at" in log
    assert ": done in" not in log.split("start-up: connecting to Redis")[-1], log  # the step did not finish
    return took, log


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_waiting_for_redis_stops_on_one_signal(procs: Procs, sig: signal.Signals) -> None:
    url = f"redis://127.0.0.1:{_free_port()}/0"  # nothing listens: connection refused, then a pause
    took, log = _stop_and_time(procs, url, sig, "attempt 3")
    assert took < 10, log  # the wait looks every 0.1 s; the rest is a busy machine
    # the hint is said once; later attempts are one short line each
    assert log.count(HINT) == 1, log
    assert "still not reachable (attempt 2" in log and "still not reachable (attempt 3" in log, log


def test_a_worker_stops_during_an_attempt_that_hangs(procs: Procs, silent_server: int) -> None:
    url = f"redis://127.0.0.1:{silent_server}/0"
    took, log = _stop_and_time(procs, url, signal.SIGTERM, "start-up: connecting to Redis")
    assert took < 10, log
    assert "attempt 1" not in log, log  # the signal came while the first PING still waited for an answer


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_supervisor_waiting_for_redis_stops_on_one_signal(procs: Procs, sig: signal.Signals) -> None:
    # With --processes 2 the supervisor waits for Redis before it starts its children: the same
    # signal ends its wait the same way (exit 0, a log line), not by the default action (-15, 130)
    url = f"redis://127.0.0.1:{_free_port()}/0"
    w = procs.start(worker_argv(url, "t-unreachable", "w-unreachable", "--processes", "2"), tag="w")
    wait_for(lambda: "attempt 2" in w.stderr(), 180, "attempt 2", procs=[w])
    time.sleep(0.3)
    t0 = time.monotonic()
    w.popen.send_signal(sig)
    rc = w.wait(timeout=30)
    took = time.monotonic() - t0
    log = w.stderr()
    print(f"\n[wait-for-redis] supervisor, {sig.name} while waiting: exited {rc} after {took:.2f}s")
    assert rc == 0, log
    assert f"{sig.name} received while waiting for Redis" in log and "stopping" in log, log
    assert took < 10, log
