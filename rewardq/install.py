"""Which install extra the command line needs, and the one-line message when it is missing.

``pip install rewardq`` is the producer side and the verl adapter only; the command line and
the workers need the ``worker`` extra. Without it, every command ends with one line that
says what to install (exit code 2) instead of an ImportError traceback
(:mod:`rewardq.__main__` and :mod:`rewardq.cli` use these helpers).
"""

from __future__ import annotations

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
    """Raise MissingExtra naming the first worker-extra module that is not installed (no imports)."""
    import importlib.util

    from rewardq.errors import MissingExtra

    for module in sorted(WORKER_MODULES):
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(module)
