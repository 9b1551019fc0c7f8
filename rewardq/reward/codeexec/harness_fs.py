"""The filesystem a sandboxed program sees, set up by the harness's supervisor inside fresh
mount/pid namespaces while it is still root (:func:`build_filesystem`).

Loaded by path from :mod:`.harness` (standard library only, never rewardq), and only when
namespaces are on.
"""

from __future__ import annotations

import ctypes
import os
import re
from typing import Any

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE, MS_REC = 32, 1024, 2048, 4096, 8192, 16384
MS_RELATIME = 1 << 21
_KEPT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:

    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    if _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mount_points() -> list[tuple[str, int]]:
    """Every mount point (``/proc/self/mountinfo`` order) with the flags a remount must keep."""
    out, seen = [], set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point in seen:
                continue
            seen.add(point)
            kept = 0
            for opt in fields[5].split(","):
                kept |= _KEPT_FLAGS.get(opt, 0)
            out.append((point, kept))
    return out


def _read_only(point: str, kept: int) -> None:
    _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


_SKIPPED = ("/proc", "/sys", "/tmp", "/dev/shm")


def world_writable(max_depth: int = 3) -> list[str]:
    """Folders anyone may write (not ``/proc``, ``/sys``, ``/tmp``, ``/dev/shm``, which get views
    of their own), down to ``max_depth`` levels: where a process outside the sandbox, or an
    earlier job, could leave a socket or a file for a program to find."""
    found: list[str] = []
    level = ["/"]
    for _ in range(max_depth):
        below = []
        for folder in level:
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                path = entry.path
                if path in _SKIPPED or not entry.is_dir(follow_symlinks=False):
                    continue
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                if mode & 0o002:
                    found.append(path)
                else:
                    below.append(path)
        level = below
    return found


def build_filesystem(job: dict[str, Any]) -> str:
    """Inside fresh mount/pid namespaces, as root: the view the program gets. Returns its work dir.

    Every mount read-only but the job's own ``/proc`` (a fresh one showing only the job's
    processes, where the runner sets ``oom_score_adj``; as writable as ``/proc`` is for any
    unprivileged process); a fresh tmpfs on ``/tmp`` (root's, 0755) holding the work dir (the
    sandbox uid's, 0700); ``job["hide"]`` (the worker adds :func:`world_writable` to it) covered
    by empty read-only tmpfs, with the ``job["expose"]`` folders under them (the interpreter, the
    venv) bound back read-only; a private ``/dev/shm``. All of it vanishes with the namespace.
    """
    size = f"size={int(job['limits']['file_mb']) * 4}m"
    for point, kept in _mount_points():
        if point != "/proc":
            _read_only(point, kept)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=755")
    work = "/tmp/work"
    os.mkdir(work, 0o700)
    os.chown(work, job["uid"], job["uid"])
    staged = []
    for i, path in enumerate(job["expose"]):
        stage = f"/tmp/.expose{i}"
        os.mkdir(stage, 0o700)
        _mount(path, stage, None, MS_BIND | MS_REC)
        staged.append((stage, path))
    hidden = [h for h in job["hide"] if os.path.isdir(h) and not os.path.islink(h)]
    for h in hidden:
        _mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for stage, path in staged:
        os.makedirs(path, 0o755, exist_ok=True)
        _mount(stage, path, None, MS_MOVE)
        os.rmdir(stage)
    for h in hidden:
        _read_only(h, MS_NOSUID | MS_NODEV)
    for _, path in staged:
        _read_only(path, MS_NOSUID | MS_NODEV)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    return work
