"""The exit code of an error that ends a command, and the one line that explains it.

One mapping for both places a command can end: the CLI, which prints the line and exits with
the code, and a worker process whose exit is forced after it stopped
(:mod:`rewardq.consumers.compose`), which must exit with the same code even when ending the
event loop takes too long for the CLI to get there.
"""

from __future__ import annotations

from rewardq.errors import MissingExtra, RewardqError
from rewardq.install import missing_worker_module
from rewardq.queue import connection as rx

EXIT_FAILED, EXIT_CONFIG, EXIT_REDIS, EXIT_INTERRUPTED = 1, 2, 3, 130


def explain(exc: BaseException) -> tuple[int, str] | None:
    """``(exit code, one line)`` for an error rewardq expects; None for any other (a bug: 1)."""
    module = missing_worker_module(exc)
    if module is not None:
        exc = MissingExtra(module)
    if isinstance(exc, RewardqError):
        return exc.exit_code, str(exc)
    if isinstance(exc, rx.NoPermissionError):
        return EXIT_CONFIG, (
            f"Redis refused a command for lack of permission ({exc}); grant the ACL user the rewardq "
            "namespace's keys (~<namespace>:*) and its commands (see docs/failures.md)"
        )
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError)):
        return EXIT_REDIS, f"lost the connection to Redis ({exc}); check the server and --redis-url, then run again"
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    return None


def exit_code_of(exc: BaseException) -> int:
    """The code a command ends with for ``exc`` (:func:`explain`; 1 for an unexpected error)."""
    explained = explain(exc)
    return EXIT_FAILED if explained is None else explained[0]
