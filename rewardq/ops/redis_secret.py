"""Keep the Redis URL (and its password) out of every place a program of the same user can read.

With ``code_local_isolation=rlimits`` and a worker that is not root, the programs the worker
runs have the worker's uid, so anything the worker's user can read they can read too, unless
the worker hides it. The URL therefore never sits where such a program looks:

* **the command line** (``/proc/<pid>/cmdline`` is readable by everyone): pass the URL in a
  file, ``REWARDQ_REDIS_URL_FILE=/path`` (its first line; it wins over ``REWARDQ_REDIS_URL``,
  and ``--redis-url`` wins over both), or in ``REWARDQ_REDIS_URL``; ``rewardq worker
  --processes N`` never puts it on its children's command lines either (they get it in their
  environment and remove it at once);
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
from collections.abc import MutableMapping

from rewardq.errors import ConfigError

logger = logging.getLogger("rewardq.cli")

URL_ENV = "REWARDQ_REDIS_URL"
URL_FILE_ENV = "REWARDQ_REDIS_URL_FILE"
_PR_SET_DUMPABLE = 4


def read_url_file(environ: MutableMapping[str, str] | None = None) -> str | None:
    """The URL in the file ``REWARDQ_REDIS_URL_FILE`` names (its first line), or None when unset.

    Raises:
        ConfigError: the file cannot be read or holds no URL.
    """
    env = os.environ if environ is None else environ
    path = env.get(URL_FILE_ENV)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            url = f.readline().strip()
    except OSError as exc:
        raise ConfigError(f"{URL_FILE_ENV}={path}: cannot read the Redis URL file ({exc.strerror})") from None
    if "://" not in url:
        raise ConfigError(f"{URL_FILE_ENV}={path}: the file's first line must be a Redis URL (redis://...)")
    return url


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
    os.environ.pop(URL_ENV, None)
    try:
        _scrub_c_environment(URL_ENV)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    except (OSError, AttributeError) as exc:  # not Linux / glibc
        logger.warning("could not hide the Redis URL from programs of this user (%s)", exc)


def warn_if_on_command_line(url_from_flag: str | None) -> None:
    """Warn when ``--redis-url`` carries a password (everyone on the host can read it)."""
    if url_from_flag and "@" in url_from_flag.split("://", 1)[-1]:
        logger.warning(
            "--redis-url holds a password, visible to every process on this host in /proc/<pid>/cmdline: "
            "pass it in a file (%s=/path) or in %s instead",
            URL_FILE_ENV,
            URL_ENV,
        )


def child_environment(url: str) -> dict[str, str]:
    """The environment of a ``--processes`` child: this one's, with the URL in ``REWARDQ_REDIS_URL``
    (unless the children read the same file), never on their command line."""
    env = os.environ.copy()
    if not env.get(URL_FILE_ENV):
        env[URL_ENV] = url
    return env
