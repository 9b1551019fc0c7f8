"""The explicit registry of reward managers.

Built-in managers register themselves with :func:`register` when their module is
imported by :func:`_load_builtins`; third-party packages add theirs through the
``rewardq.managers`` entry-point group; anything else is named ``package.module:ClassName``.
Unknown names fail fast with the list of known ones.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import TypeVar

from rewardq.errors import UnknownManagerError
from rewardq.reward.base import RewardManager

logger = logging.getLogger("rewardq.reward")

ENTRY_POINT_GROUP = "rewardq.managers"
#: Modules holding the built-in managers, imported on first lookup.
BUILTIN_MODULES = (
    "rewardq.reward.managers.naive",
    "rewardq.reward.managers.dapo",
    "rewardq.reward.managers.gdpo",
    "rewardq.reward.managers.limited",
    "rewardq.reward.managers.remote",
    "rewardq.reward.managers.disrm",
)

_REGISTRY: dict[str, type[RewardManager]] = {}
_loaded = False
M = TypeVar("M", bound=type[RewardManager])


def register(name: str) -> Callable[[M], M]:
    """Class decorator: register a manager under ``name``. Duplicate names are refused."""

    def deco(cls: M) -> M:
        if not (isinstance(cls, type) and issubclass(cls, RewardManager)):
            raise TypeError(f"{cls!r} is not a RewardManager subclass")
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(
                f"reward manager {name!r} is already registered by {existing.__module__}.{existing.__qualname__}"
            )
        _REGISTRY[name] = cls
        cls.name = name
        return cls

    return deco


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise
            logger.debug("built-in manager module %s not present", mod)


def _entry_point_classes() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_managers() -> list[str]:
    """Every name ``--manager`` accepts (built-ins and installed entry points)."""
    _load_builtins()
    return sorted(set(_REGISTRY) | set(_entry_point_classes()))


def import_object(spec: str, what: str = "object") -> object:
    """Import ``package.module:attr`` (``attr`` may be dotted)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form package.module:Name")
    module = importlib.import_module(module_name)
    obj: object = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def get_manager_class(spec: str) -> type[RewardManager]:
    """Resolve ``--manager``: a registered name, an entry point, or ``package.module:ClassName``."""
    _load_builtins()
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    eps = _entry_point_classes()
    if spec in eps:
        cls = eps[spec].load()
    elif ":" in spec:
        try:
            cls = import_object(spec, "manager")
        except (ImportError, AttributeError, ValueError) as exc:
            raise UnknownManagerError(
                f"cannot import manager {spec!r}: {exc}. Check that the module is "
                "importable on the worker (PYTHONPATH) and the class name"
            ) from None
    else:
        raise UnknownManagerError(
            f"unknown reward manager {spec!r}; known: {', '.join(known_managers())}; "
            "or give a custom one as package.module:ClassName"
        )
    if not (isinstance(cls, type) and issubclass(cls, RewardManager)):
        raise UnknownManagerError(f"{spec!r} is not a subclass of rewardq.reward.RewardManager")
    return cls
