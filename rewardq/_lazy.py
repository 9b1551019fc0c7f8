"""Lazy public names for a package ``__init__`` (PEP 562 module ``__getattr__``).

A package lists ``{public name: module that defines it}``; the module is imported on first
access and the value cached in the package. Written here rather than taken from ``lazy_loader``:
it is these few lines, and the core install (which rollout processes inside a trainer import)
stays at redis, msgpack and numpy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_getattr(package: str, exports: Mapping[str, str], namespace: dict[str, object]) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package`` (its ``__name__``) that imports ``exports[name]``
    on first use and caches the value in ``namespace`` (the package's ``globals()``)."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
