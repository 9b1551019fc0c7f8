"""Keep the Redis URL (and its password) out of every place a program of the same user can read.

With ``code_local_isolation=rlimits`` and a worker that is not root, the programs the worker
runs have the worker's uid, so anything the worker's user can read they can read too, unless
the worker hides it. The URL therefore never sits where such a program looks:

* **the command line** (``/proc/<pid>/cmdline`` is readable by everyone): pass the URL in a
  file (the ``redis_url_file`` setting: ``--redis-url-file``, ``REWARDQ_REDIS_URL_FILE`` or
  the config file; its first line replaces ``redis_url`` from any layer but ``--redis-url``),
  or in ``REWARDQ_REDIS_URL``; ``rewardq worker --processes N`` never puts it on its
  children's command lines either (they get it in their environment and remove it at once);
* **the environment**: :func:`conceal` removes ``REWARDQ_REDIS_URL`` from ``os.environ`` and
  from the C environment, and overwrites its bytes in the process's initial environment
  block, which ``/proc/<pid>/environ`` shows whatever ``unsetenv`` does;
* **the process itself**: :func:`conceal` also clears the "dumpable" flag, which makes
  ``/proc/<pid>/environ``, ``mem`` and ``fd/`` root's and forbids ptrace by the same user.

The URL file stays readable by the worker's user; Landlock (``harness_guard``) keeps the
programs from reading it, or any file outside the interpreter's folders.
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger("rewardq.cli")

URL_ENV = "REWARDQ_REDIS_URL"
URL_FILE_ENV = "REWARDQ_REDIS_URL_FILE"
_PR_SET_DUMPABLE = 4


def _scrub_c_environment(name: str) -> None:
    """Zero the value of ``name`` where the C environment holds it, then unset it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.getenv.restype = ctypes.c_void_p
    libc.getenv.argtypes = [ctypes.c_char_p]
    pointer = libc.getenv(name.encode())
    if pointer:
        ctypes.memset(pointer, 0, len(ctypes.string_at(pointer)))
    libc.unsetenv(name.encode())


def conceal() -> None:
    """Remove ``REWARDQ_REDIS_URL`` from this process (see the module docstring) and make the
    process undumpable. Idempotent; a no-op for what is not set."""
    try:
        _scrub_c_environment(URL_ENV)  # first: os.environ.pop unsets it, and getenv then finds nothing to zero
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    except (OSError, AttributeError) as exc:  # not Linux / glibc
        logger.warning("could not hide the Redis URL from programs of this user (%s)", exc)
    os.environ.pop(URL_ENV, None)


def warn_if_on_command_line(url_from_flag: str | None) -> None:
    """Warn when ``--redis-url`` carries a password (everyone on the host can read it)."""
    if url_from_flag and "@" in url_from_flag.split("://", 1)[-1]:
        logger.warning(
            "--redis-url holds a password, visible to every process on this host in /proc/<pid>/cmdline: "
            "pass it in a file (%s=/path) or in %s instead",
            URL_FILE_ENV,
            URL_ENV,
        )


def child_environment(url: str, *, from_flag: bool) -> dict[str, str]:
    """The environment of a ``--processes`` child: this one's, with the URL in ``REWARDQ_REDIS_URL``,
    never on its command line. A URL given with ``--redis-url`` replaces any URL file."""
    env = os.environ.copy()
    env[URL_ENV] = url
    if from_flag:
        env.pop(URL_FILE_ENV, None)
    return env
