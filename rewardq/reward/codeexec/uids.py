"""A uid per sandbox job, never held by two live jobs on one host at once.

A job's uid is what separates it from every other job: its processes, its ``RLIMIT_NPROC``
count, its files. :class:`UidPool` draws uids from ``[base, base + count)`` and holds each
with an exclusive ``flock`` on ``<lock_dir>/<uid>`` while the job lives; the lock goes with
the holder, so a worker that dies frees its uids at once, and every worker process on the
host (all ``--processes`` children, several workers) sees the same locks. ``lock_dir``
(default ``/run/rewardq/sandbox-uids``) is root's, mode 0700, and hidden from programs.
"""

from __future__ import annotations

import fcntl
import os
import random
from dataclasses import dataclass

from rewardq.errors import CodeSandboxError
from rewardq.queue.states import FailureKind

#: Local runner as root: each job runs as a uid of [BASE, BASE + COUNT) that no other live job
#: on this host holds (a lock file per uid in CODE_UID_LOCK_DIR).
CODE_SANDBOX_UID_BASE = 61000
CODE_SANDBOX_UID_COUNT = 4000
CODE_UID_LOCK_DIR = "/run/rewardq/sandbox-uids"


@dataclass
class UidLease:
    """One uid, held until :meth:`release`."""

    uid: int
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


class UidPool:
    """Hands out uids no other live job holds (see the module docstring)."""

    def __init__(
        self,
        base: int = CODE_SANDBOX_UID_BASE,
        count: int = CODE_SANDBOX_UID_COUNT,
        lock_dir: str = CODE_UID_LOCK_DIR,
    ) -> None:
        self.base, self.count, self.lock_dir = base, count, lock_dir

    def check(self) -> None:
        """Make the lock folder (root's, 0700).

        Raises:
            CodeSandboxError: it cannot be made or is not root's.
        """
        try:
            os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)
            st = os.stat(self.lock_dir)
        except OSError as exc:
            raise CodeSandboxError(f"cannot make the sandbox uid lock folder {self.lock_dir} ({exc})") from None
        if st.st_uid != 0 or st.st_mode & 0o077:
            raise CodeSandboxError(f"{self.lock_dir} must be root's with mode 0700 (it holds the sandbox uid locks)")

    def acquire(self) -> UidLease:
        """A uid that no live job holds.

        Raises:
            CodeSandboxError: every uid of the range is held (more live jobs than uids).
        """
        start = random.randrange(self.count)
        for i in range(self.count):
            uid = self.base + (start + i) % self.count
            fd = os.open(os.path.join(self.lock_dir, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return UidLease(uid, fd)
        raise CodeSandboxError(  # they free up as those jobs end: worth trying again
            f"all {self.count} sandbox uids from {self.base} are held by live jobs", failure_kind=FailureKind.TRANSIENT
        )
