"""What one call may change in its scorer process, put back before the next call sees it.

A scorer process serves many calls, of many trajectories. A reward function that changes its
process (``os.chdir``, ``os.environ["PATH"] = ...``, ``signal.signal(SIGTERM, SIG_IGN)``, a
pending ``signal.alarm``, ``sys.stdout = ...``) must not change what the next call runs in, nor
how the pool stops the process. :class:`ProcessState` takes a snapshot once the function is
loaded (what its import set up is the baseline) and :meth:`ProcessState.restore` puts back,
after every call:

* the working directory and the umask;
* the environment (``os.environ``: added, removed and changed variables);
* every named signal's Python-level handler (``SIGTERM``, ``SIGALRM``, ... ; not the unnamed
  real-time ones), the signal mask, and the interval timers (a pending ``alarm``);
* ``sys.stdout``, ``sys.stderr`` and ``sys.stdin``, and file descriptors 0, 1 and 2.

Each is compared first and written only when it changed, so an ordinary call costs a few
dozen microseconds. Not covered: module globals, ``sys.path``, threads the call left running.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

_UNSETTABLE = {signal.SIGKILL, signal.SIGSTOP}
#: The C functions under ``signal.getsignal``/``signal.signal``, without their enum conversion
#: (which costs ~0.5 µs a signal; these ~0.03).
_C = getattr(signal, "_signal", signal)
_TIMERS = tuple(getattr(signal, n) for n in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF") if hasattr(signal, n))


class ProcessState:
    """A snapshot of what a call may change in its process (see the module docstring).

    ``fds`` maps 0, 1 and 2 to descriptors that hold what they pointed at when the snapshot
    was taken (kept open, not inherited), to ``dup2`` back after a call that replaced them.
    """

    def __init__(self, fds: dict[int, int] | None = None) -> None:
        self.cwd = os.getcwd()
        self.umask = os.umask(0)
        os.umask(self.umask)
        self.environ = dict(os.environ)
        self._raw_environ = dict(_raw(os.environ))
        self.signals = tuple(s for s in signal.Signals if s not in _UNSETTABLE and _handler(s) is not None)
        self.handlers = list(map(_C.getsignal, self.signals))
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, []) if hasattr(signal, "pthread_sigmask") else None
        self.streams = (sys.stdin, sys.stdout, sys.stderr)
        self.fds = dict(fds) if fds is not None else {fd: os.dup(fd) for fd in (0, 1, 2) if _is_open(fd)}
        self.fd_ids = {fd: _identity(fd) for fd in self.fds}

    def restore(self) -> list[str]:
        """Put back whatever changed since the snapshot; the names of what was put back."""
        changed: list[str] = []
        if _cwd() != self.cwd:
            try:
                os.chdir(self.cwd)
                changed.append("cwd")
            except OSError:
                pass
        mask = os.umask(self.umask)
        if mask != self.umask:
            changed.append("umask")
        if _raw(os.environ) != self._raw_environ:
            for key in [k for k in os.environ if k not in self.environ]:
                del os.environ[key]
            for key, value in self.environ.items():
                if os.environ.get(key) != value:
                    os.environ[key] = value
            changed.append("environment")
        if self._restore_signals():
            changed.append("signal handlers")
        if self.mask is not None and signal.pthread_sigmask(signal.SIG_SETMASK, self.mask) != self.mask:
            changed.append("signal mask")
        for timer in _TIMERS:
            if signal.getitimer(timer) != (0.0, 0.0):
                signal.setitimer(timer, 0.0)
                changed.append("timers")
        if (sys.stdin, sys.stdout, sys.stderr) != self.streams:
            sys.stdin, sys.stdout, sys.stderr = self.streams
            changed.append("sys.stdout/stderr")
        for fd, saved in self.fds.items():
            if _identity(fd) != self.fd_ids[fd]:
                os.dup2(saved, fd)
                changed.append(f"fd {fd}")
        return changed

    def _restore_signals(self) -> bool:
        now = list(map(_C.getsignal, self.signals))
        if now == self.handlers:
            return False
        for sig, was, handler in zip(self.signals, now, self.handlers):
            if was != handler:
                try:
                    _C.signal(sig, handler)
                except (ValueError, OSError, TypeError):
                    continue
        return True


def _handler(sig: int) -> object:
    try:
        return signal.getsignal(sig)
    except (ValueError, OSError):
        return None


def _raw(environ: Any) -> Any:
    """``os.environ``'s own mapping of encoded names to values (compared in C), or a copy of it."""
    data = getattr(environ, "_data", None)
    return data if isinstance(data, dict) else dict(environ)


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the call removed it
        return None


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _identity(fd: int) -> tuple[int, int] | None:
    """What ``fd`` points at (device and inode), or None when it is closed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
