"""The guardian between a Ray fleet actor and its ``rewardq worker`` process.

``python -m rewardq.integrations.ray.guardian ACTOR_PID STATE WORKER_ARGS...`` runs
``python -m rewardq WORKER_ARGS...`` and ends it gracefully when the actor ends, however it ends.

Why a guardian: Ray ends an actor's processes abruptly. An actor that exits SIGKILLs its
descendants (``RAY_kill_child_processes_on_worker_exit``, on by default), so a worker started as
the actor's child would get no time to finish the trajectories it holds. The guardian forks
once and the forking parent exits at once, so the guardian and the worker are nobody's
descendants but init's; the guardian watches the actor's process (a pidfd, else polling
``/proc``) and, when it is gone, sends the worker SIGTERM: the worker stops reading, finishes
what it holds within ``shutdown_grace`` and exits. A SIGTERM to the guardian is passed on the
same way. The worker asks the kernel for SIGTERM should the guardian itself die
(``PR_SET_PDEATHSIG``), and runs in a session of its own (its process group is what a forced
stop kills).

The actor reads what happens from two files next to ``STATE``: ``STATE.pid`` (``<worker pid>
<guardian pid>``, once the worker runs) and ``STATE.rc`` (the worker's exit code, written when it
ended; ``128 + N`` for a signal N). Linux only, as the rest of the Ray fleet.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

#: Seconds between two looks at the actor when no pidfd is available.
POLL_S = 0.5


def _die_with_parent() -> None:
    """In the worker, before exec: SIGTERM when the guardian dies (PR_SET_PDEATHSIG)."""
    prctl = getattr(ctypes.CDLL(None), "prctl", None)
    if prctl is not None:
        prctl(1, int(signal.SIGTERM))


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: the actor never reads half a file


def _actor_gone(actor: int, pidfd: int | None, timeout: float) -> bool:
    if pidfd is not None:
        return bool(select.select([pidfd], [], [], timeout)[0])
    time.sleep(timeout)
    return not os.path.exists(f"/proc/{actor}")


def main(argv: list[str]) -> int:
    actor, state, worker_args = int(argv[0]), Path(argv[1]), argv[2:]
    try:
        pidfd: int | None = os.pidfd_open(actor)  # taken while the actor is alive: immune to pid reuse
    except (AttributeError, OSError):
        pidfd = None
    if os.getppid() != actor:
        return 0  # the actor is gone already
    if os.fork() > 0:
        os._exit(0)  # the forking parent ends at once: the guardian is no descendant of the actor
    os.setsid()
    worker = subprocess.Popen(
        [sys.executable, "-m", "rewardq", *worker_args], preexec_fn=_die_with_parent, start_new_session=True
    )
    _write(state.with_name(state.name + ".pid"), f"{worker.pid} {os.getpid()}")

    def stop(signum: int = signal.SIGTERM, frame: object = None) -> None:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stopped = False
    while worker.poll() is None:
        if not stopped and _actor_gone(actor, pidfd, POLL_S):
            stop()
            stopped = True
        elif stopped:
            time.sleep(POLL_S)
    rc = worker.returncode
    _write(state.with_name(state.name + ".rc"), str(128 - rc if rc < 0 else rc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
