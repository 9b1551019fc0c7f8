"""The ``rewardq`` console script and ``python -m rewardq``.

``pip install rewardq`` is the producer side and the verl adapter only; the command line and
the workers need the ``worker`` extra. Without it, every command ends with one line that
says what to install (exit code 2) instead of an ImportError traceback.
"""

from __future__ import annotations

import sys

#: Top-level modules that come with ``rewardq[worker]`` (and not with the core install).
WORKER_MODULES = frozenset(
    {"torch", "tensordict", "tokenizers", "click", "rich", "yaml", "prometheus_client", "aiohttp"}
)


def missing_worker_module(exc: BaseException) -> str | None:
    """The worker-extra module whose absence raised ``exc``, or None for any other error."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.partition(".")[0]
    return top if top in WORKER_MODULES else None


def require_worker_extra() -> None:
    """Raise MissingDependency naming the first worker-extra module that is not installed (no imports)."""
    import importlib.util

    from rewardq.errors import MissingDependency

    for module in sorted(WORKER_MODULES):
        if importlib.util.find_spec(module) is None:
            raise MissingDependency(module)


def main() -> None:
    """Run the CLI; report a missing worker dependency as one line and exit 2."""
    try:
        from rewardq.cli import main as cli_main
    except ModuleNotFoundError as exc:
        module = missing_worker_module(exc)
        if module is None:
            raise
        from rewardq.errors import MissingDependency

        sys.stderr.write(f"error: {MissingDependency(module)}\n")
        sys.exit(2)
    cli_main()


if __name__ == "__main__":
    main()
