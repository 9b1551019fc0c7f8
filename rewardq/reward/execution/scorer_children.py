"""Processes a reward function leaves behind, found through ``/proc`` and killed.

A scorer process (:mod:`rewardq.reward.execution.scorer_process`) starts as the leader of a process group
of its own and, on Linux, as a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): whatever a call
forks, daemonised or not, stays its descendant, and an orphan comes back to it as a direct child.
So when a call ends, :func:`kill_leftovers` kills every child that was not there before the first
call, and reaps it, pass after pass until none is left (the orphans of a killed child come back
as children of their own). Children the function started while it was loaded (a helper server
it keeps) are spared.

When the pool kills a scorer process (a timeout, a caller that gave up, shutdown), its end of
the slot (:meth:`ScorerSlot.stop`) first kills the process's descendants (:func:`descendants`),
then the process, then what is left of its process group.

Every walk is bounded (``MAX_PROCESSES`` processes, ``MAX_PASSES`` passes) and nothing here needs
psutil: a process's children are ``/proc/<pid>/task/<tid>/children``, or, on a kernel without
that file, the processes whose ``/proc/<pid>/stat`` names it as their parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

#: Seconds a scorer process waits, after a call, for what its killed leftover children held.
SCORER_CHILD_REAP = 1.0


PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
#: Most processes one walk collects; most kill-and-reap passes after one call.
MAX_PROCESSES = 4096
MAX_PASSES = 64


def become_reaper(*, die_with_parent: bool = False) -> None:
    """Lead a process group of our own, adopt orphaned descendants, and (``die_with_parent``)
    be SIGKILLed when our parent ends. The last is only safe when the parent is a process whose
    life is the pool's, such as the forkserver: the kernel sends it when the parent *thread* ends.

    Each step is best-effort: a platform without ``prctl`` keeps only the process group.
    """
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if die_with_parent:
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _parent_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        return int(raw[raw.rfind(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _has_children_files() -> bool:
    """Whether this kernel lists a thread's children in ``/proc/<pid>/task/<tid>/children``."""
    global _CHILDREN_FILES
    if _CHILDREN_FILES is None:
        _CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
    return _CHILDREN_FILES


_CHILDREN_FILES: bool | None = None


def children(pid: int) -> set[int]:
    """The direct children of ``pid`` (empty when it is gone or ``/proc`` cannot say)."""
    if not _has_children_files():
        return _children_by_scan(pid)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return set()
    found: set[int] = set()
    for tid in tids:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY)
        except OSError:  # the thread ended meanwhile
            continue
        try:
            raw = b""
            while chunk := os.read(fd, 65536):
                raw += chunk
        except OSError:
            continue
        finally:
            os.close(fd)
        found.update(int(p) for p in raw.split())
    return found


def _children_by_scan(pid: int) -> set[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    return {int(n) for n in names if n.isdigit() and _parent_of(n) == pid}


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, parents before their children (at most ``MAX_PROCESSES``)."""
    out: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo and len(out) < MAX_PROCESSES:
        for child in sorted(children(todo.pop(0))):
            if child not in seen:
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out[:MAX_PROCESSES]


def kill(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def kill_leftovers(keep: set[int], *, wait: float = SCORER_CHILD_REAP) -> int:
    """Kill and reap this process's children other than ``keep`` (and what they leave behind);
    how many were killed. Gives up on what is still there after ``wait`` seconds."""
    if not keep:
        try:
            os.waitpid(-1, os.WNOHANG)  # reaps at most one that already ended; the scan sees the rest
        except ChildProcessError:
            return 0  # no child at all, alive or ended: one system call instead of reading /proc
    me = os.getpid()
    killed = 0
    deadline = time.monotonic() + wait
    for _ in range(MAX_PASSES):
        left = children(me) - keep
        if not left:
            break
        tree = [pid for child in left for pid in (child, *descendants(child))]
        kill(tree)
        killed += sum(1 for pid in left if _reap(pid, deadline))
        if time.monotonic() > deadline:
            break
    return killed


def _reap(pid: int, deadline: float) -> bool:
    """Wait (until ``deadline``) for child ``pid`` to end; True when it did and was ours to reap."""
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True  # reaped already (by the function's own code)
        if done:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
