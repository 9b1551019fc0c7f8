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


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def outermost(paths: list[str]) -> list[str]:
    """``paths`` without those that lie under another of them, sorted."""
    out: list[str] = []
    for p in sorted(set(paths)):
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out


def interpreter_prefixes() -> list[str]:
    """This interpreter's prefixes (``sys.prefix``, ``sys.base_prefix`` and the exec ones: the
    standard library, ``lib-dynload``, a venv's site-packages), as real paths, outermost only."""
    import sys

    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    return outermost([os.path.realpath(p) for p in prefixes])


def interpreter_paths() -> list[str]:
    """Where this interpreter reads its library: :func:`interpreter_prefixes` and every existing
    ``sys.path`` entry (what site-packages' ``.pth`` files add), as real paths, outermost only.

    Run in the harness (``python -I``), this is what a sandboxed program's imports read.
    """
    import sys

    found = [*interpreter_prefixes(), *(os.path.realpath(p) for p in sys.path if p and os.path.exists(p))]
    return outermost(found)


def closed_folder(path: str) -> str | None:
    """The outermost folder on the way to ``path`` (``path`` included) that other users cannot
    enter (no ``o+x``), or None: a program running as another uid cannot read ``path`` then."""
    current = "/"
    for part in [p for p in os.path.realpath(path).split("/") if p]:
        current = os.path.join(current, part)
        try:
            st = os.stat(current)
        except OSError:
            return None
        if st.st_mode & 0o040000 and not st.st_mode & 0o001:  # a folder others may not enter
            return current
    return None


def readable_by_others(path: str) -> bool:
    """Whether a process of another uid (no shared group) can read the file ``path``."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return bool(mode & 0o004) and closed_folder(os.path.dirname(os.path.realpath(path))) is None


def _is_mount_point(path: str) -> bool:
    return any(point == path for point, _ in _mount_points())


def build_filesystem(job: dict[str, Any]) -> str:
    """Inside fresh mount/pid namespaces, as root: the view the program gets. Returns its work dir.

    Every mount read-only but the job's own ``/proc`` (a fresh one showing only the job's
    processes, where the runner sets ``oom_score_adj``; as writable as ``/proc`` is for any
    unprivileged process); a fresh tmpfs on ``/tmp`` (root's, 0755) holding the work dir (the
    sandbox uid's, 0700); ``job["hide"]`` (the worker adds :func:`world_writable` to it), every
    folder on the way to the interpreter that other users cannot enter (a 0700 home holding
    pyenv, conda or a venv) and the folder of a secret that is a mount of its own (a Kubernetes
    secret volume) covered by empty read-only tmpfs; the interpreter's own folders
    (:func:`interpreter_paths`) that lie under any of these or under ``/tmp`` bound back
    read-only at their own paths; every file of ``job["secrets"]`` covered by an empty read-only
    file whatever its mode; a private ``/dev/shm``. All of it vanishes with the namespace.
    """
    size = f"size={int(job['limits']['file_mb']) * 4}m"
    library = interpreter_paths()
    secrets = [os.path.realpath(p) for p in job.get("secrets", ()) if os.path.isfile(p)]
    closed = [c for c in (closed_folder(p) for p in library) if c is not None]
    volumes = [os.path.dirname(s) for s in secrets if os.path.dirname(s) != "/" and _is_mount_point(os.path.dirname(s))]
    fresh = ("/tmp", "/dev/shm")  # replaced by tmpfs of the job's own: nothing under them needs covering
    hide = [h for h in [*job["hide"], *closed, *volumes] if not any(_under(h, f) for f in fresh)]
    hide = outermost([h for h in hide if os.path.isdir(h) and not os.path.islink(h)])
    expose = outermost([p for p in library if any(_under(p, h) for h in [*hide, *fresh])])
    # opened before anything covers them: bound back from these descriptors once covered
    handles = [(os.open(p, os.O_PATH | os.O_CLOEXEC), p, os.path.isdir(p)) for p in expose]
    for point, kept in _mount_points():
        if point != "/proc":
            _read_only(point, kept)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=755")
    work = "/tmp/work"
    os.mkdir(work, 0o700)
    os.chown(work, job["uid"], job["uid"])
    for h in hide:
        _mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for fd, path, is_dir in handles:
        if is_dir:
            os.makedirs(path, 0o755, exist_ok=True)
        else:  # a zip on sys.path
            os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    for h in hide:
        _read_only(h, MS_NOSUID | MS_NODEV)
    for _, path, _ in handles:
        _read_only(path, MS_NOSUID | MS_NODEV)
    for secret in secrets:  # one under a fresh tmpfs, and not bound back, is gone already
        if not any(_under(secret, h) for h in [*hide, *fresh]) or any(_under(secret, p) for p in expose):
            _mount("/dev/null", secret, None, MS_BIND)
            _read_only(secret, MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    return work
