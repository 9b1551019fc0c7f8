"""``rewardq worker --processes N``: keep N worker processes alive on one machine.

Each child is ``python -m rewardq worker ...`` with the parent's flags (minus ``--processes``;
``--name X`` becomes ``X-0 … X-(N-1)`` and ``--metrics-port P`` becomes ``P+i`` so children
never collide). The supervisor:

* restarts a child that dies (crash, OOM kill, exit code other than 0 and 2) after a backoff
  that doubles from 1 s to 30 s (:func:`rewardq.backoff.compute_backoff`), and resets once a
  child has stayed up for 30 s (``SUPERVISOR_*`` below);
* does **not** restart a child that exits 2: that is a configuration error, which a restart
  cannot fix, so it stops the others and exits 2 as well;
* forwards SIGTERM and SIGINT to every child as SIGTERM (each finishes its in-flight
  trajectories and exits 0), escalating to SIGKILL after ``grace`` seconds;
* exits 0 when every child has exited cleanly, 1 otherwise.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rewardq.backoff import compute_backoff
from rewardq.config import WorkerConfig

#: ``rewardq worker --processes``: the first and longest pause before a dead child is restarted
#: (it doubles with each death in a row), and how long a child must stay up for the next death to
#: start from the first pause again.
SUPERVISOR_BACKOFF_START = 1.0
SUPERVISOR_BACKOFF_MAX = 30.0
SUPERVISOR_STABLE_AFTER = 30.0
#: Seconds beyond a child's ``shutdown_grace`` before the supervisor kills a child that has not stopped.
SUPERVISOR_KILL_SLACK = 10.0
#: Seconds between the supervisor's checks of its children.
SUPERVISOR_POLL = 0.1


logger = logging.getLogger("rewardq.supervisor")

__all__ = ["Supervisor", "child_argvs"]


def child_argvs(
    base: Sequence[str], n: int, *, name: str | None, metrics_port: int | None, prefix: Sequence[str] = ()
) -> list[list[str]]:
    """The command line of each of ``n`` children.

    Args:
        base: ``rewardq worker`` arguments without ``--name`` and ``--metrics-port``.
        n: number of children.
        name: the ``--name`` given to the parent, if any (child i gets ``name-i``).
        metrics_port: the parent's ``--metrics-port``, if any (child i gets ``port+i``; 0 stays 0).
        prefix: global options placed before ``worker`` (e.g. ``--debug``).
    """
    out = []
    for i in range(n):
        argv = [sys.executable, "-m", "rewardq", *prefix, "worker", *base]
        if name:
            argv += ["--name", f"{name}-{i}"]
        if metrics_port is not None:  # 0 (any free port) stays 0 for every child
            argv += ["--metrics-port", str(metrics_port + i if metrics_port else 0)]
        out.append(argv)
    return out


@dataclass
class _Slot:
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0  # deaths in a row, each after less than SUPERVISOR_STABLE_AFTER seconds up
    restart_at: float | None = None
    last_rc: int | None = None
    restarts: int = 0
    history: list[int] = field(default_factory=list)


class Supervisor:
    """Run, watch and stop a set of worker processes (see the module docstring).

    Args:
        argvs: one command line per child (from :func:`child_argvs`).
        grace: seconds a child may take to stop after SIGTERM before it is killed.
        poll: seconds between checks of the children.
        env: the children's environment (default: this process's); the Redis URL travels
            here, never on their command lines (``rewardq.ops.redis_secret``).
    """

    def __init__(
        self,
        argvs: Sequence[Sequence[str]],
        *,
        grace: float = WorkerConfig.shutdown_grace + SUPERVISOR_KILL_SLACK,
        poll: float = SUPERVISOR_POLL,
        env: dict[str, str] | None = None,
    ) -> None:
        self.slots = [_Slot(list(a)) for a in argvs]
        self.env = env
        self.grace = grace
        self.poll = poll
        self.stopping: str | None = None
        self._stop_sent_at: float | None = None
        self.fatal_rc: int | None = None

    # -- life cycle ----------------------------------------------------------------------
    def run(self, install_signal_handlers: bool = True) -> int:
        """Start every child and watch them until all have exited; returns the exit code."""
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, frame: self.request_stop(signal.Signals(signum).name))
        for i, slot in enumerate(self.slots):
            self._spawn(i, slot)
        logger.info(
            "supervising %d worker processes: %s",
            len(self.slots),
            ", ".join(str(s.proc.pid) for s in self.slots if s.proc),
        )
        while True:
            now = time.monotonic()
            for i, slot in enumerate(self.slots):
                self._check(i, slot, now)
            if self.stopping and self._stop_sent_at is not None and now - self._stop_sent_at > self.grace:
                for slot in self.slots:
                    if slot.proc is not None and slot.proc.poll() is None:
                        logger.warning("worker pid %d did not stop within %.0fs; killing it", slot.proc.pid, self.grace)
                        slot.proc.kill()
            if all(s.proc is None and s.restart_at is None for s in self.slots):
                break
            time.sleep(self.poll)
        if self.fatal_rc is not None:
            return self.fatal_rc
        clean = all(s.last_rc == 0 for s in self.slots)
        logger.info("all worker processes exited (%s)", ", ".join(str(s.last_rc) for s in self.slots))
        return 0 if clean else 1

    def request_stop(self, why: str = "requested") -> None:
        """Forward a stop to every live child (SIGTERM) and cancel pending restarts."""
        if self.stopping is None:
            logger.info("supervisor stopping (%s): sending SIGTERM to the workers", why)
            self.stopping = why
            self._stop_sent_at = time.monotonic()
        for slot in self.slots:
            slot.restart_at = None
            if slot.proc is not None and slot.proc.poll() is None:
                try:
                    slot.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass

    # -- one child -----------------------------------------------------------------------
    def _spawn(self, i: int, slot: _Slot) -> None:
        slot.proc = subprocess.Popen(slot.argv, env=self.env if self.env is not None else os.environ.copy())
        slot.started = time.monotonic()
        slot.restart_at = None
        logger.info("worker process %d started (pid %d)", i, slot.proc.pid)

    def _check(self, i: int, slot: _Slot, now: float) -> None:
        if slot.proc is None:
            if slot.restart_at is not None and now >= slot.restart_at and not self.stopping:
                slot.restarts += 1
                self._spawn(i, slot)
            return
        rc = slot.proc.poll()
        if rc is None:
            return
        pid, ran = slot.proc.pid, now - slot.started
        slot.proc, slot.last_rc = None, rc
        slot.history.append(rc)
        if self.stopping or rc == 0:
            logger.info("worker process %d (pid %d) exited with code %d", i, pid, rc)
            return
        if rc == 2:
            logger.error(
                "worker process %d (pid %d) exited with code 2 (configuration error); not restarting, "
                "stopping the others",
                i,
                pid,
            )
            self.fatal_rc = 2
            self.request_stop("a worker had a configuration error")
            return
        slot.failures = 1 if ran >= SUPERVISOR_STABLE_AFTER else slot.failures + 1
        pause = compute_backoff(slot.failures, base=SUPERVISOR_BACKOFF_START, cap=SUPERVISOR_BACKOFF_MAX)
        slot.restart_at = now + pause
        logger.warning(
            "worker process %d (pid %d) died with code %d after %.1fs; restarting in %.0fs",
            i,
            pid,
            rc,
            ran,
            pause,
        )
