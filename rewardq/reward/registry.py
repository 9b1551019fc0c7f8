"""The explicit registry of reward managers.

Built-in managers register themselves with :func:`register` when their module is
imported by :func:`_load_builtins`, under verl's names (``naive``, ``dapo``, ``gdpo``,
``rate_limited``, ``remote``) and aliases (``limited``); third-party packages add theirs
through the ``rewardq.managers`` entry-point group; anything else is named
``package.module:ClassName`` or ``path/to/file.py:ClassName`` (verl's
``reward_manager.source: importlib``). Unknown names fail fast with the list of known ones.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import TypeVar

from rewardq.errors import UnknownManagerError
from rewardq.reward.base import RewardManager
from rewardq.reward.execution.loader import import_object, is_file_spec
from rewardq.reward.options import ManagerOptions, options_class

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
    "rewardq.reward.managers.genrm",
)

#: The names (and aliases) the built-in managers register, listed without importing them (their
#: modules import torch), for ``rewardq worker --help``; a test checks it against the registry.
BUILTIN_NAMES = ("naive", "dapo", "gdpo", "rate_limited", "limited", "remote", "disrm", "genrm")

#: The built-in managers that declare options, and where the declaration is: a module without
#: torch, so ``rewardq config`` and the fingerprint read it without importing the manager.
BUILTIN_OPTIONS = {
    "genrm": "rewardq.reward.managers.genrm_options:GenRMOptions",
    "disrm": "rewardq.reward.managers.disrm_options:DisRMOptions",
}

_REGISTRY: dict[str, type[RewardManager]] = {}
_loaded = False
M = TypeVar("M", bound=type[RewardManager])


def register(name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[M], M]:
    """Class decorator: register a manager under ``name`` (and ``aliases``). Duplicate names are refused."""

    def deco(cls: M) -> M:
        if not (isinstance(cls, type) and issubclass(cls, RewardManager)):
            raise TypeError(f"{cls!r} is not a RewardManager subclass")
        for each in (name, *aliases):
            existing = _REGISTRY.get(each)
            if existing is not None and existing is not cls:
                raise ValueError(
                    f"reward manager {each!r} is already registered by {existing.__module__}.{existing.__qualname__}"
                )
        for each in (name, *aliases):
            _REGISTRY[each] = cls
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


def listed_managers() -> list[str]:
    """The names :func:`known_managers` gives, found without importing the built-in managers:
    the built-ins first, then installed entry points (e.g. ``seqpo_simt``) and other registered names."""
    rest = sorted((set(_REGISTRY) | set(_entry_point_classes())) - set(BUILTIN_NAMES))
    return [*BUILTIN_NAMES, *rest]


def _unknown(spec: str, known: list[str]) -> UnknownManagerError:
    return UnknownManagerError(
        f"unknown reward manager {spec!r}; known: {', '.join(known)}; "
        "or give a custom one as package.module:ClassName or path/to/file.py:ClassName"
    )


def check_manager_spec(spec: str, *, names_may_register: bool = False) -> None:
    """Refuse a ``--manager`` that names nothing, without importing any manager (the built-ins
    import torch, seconds of a start-up): a name that is neither built in, registered nor an
    entry point, or a ``path/to/file.py:Class`` whose file is not there. A ``module:Class`` is
    imported later by :func:`get_manager_class`, which says what is wrong with it.
    ``names_may_register``: code imported later (a ``--reward-fn`` module) may still
    :func:`register` the name, so an unknown name is left to :func:`get_manager_class`."""
    module, sep, _ = spec.rpartition(":")
    if sep and module:
        if is_file_spec(module) and not os.path.isfile(os.path.expanduser(module)):
            raise UnknownManagerError(
                f"cannot import manager {spec!r}: no such file {module!r} "
                f"(looked in {os.path.abspath(os.path.expanduser(module))!r})"
            )
        return
    if names_may_register:
        return
    if spec not in BUILTIN_NAMES and spec not in _REGISTRY and spec not in _entry_point_classes():
        raise _unknown(spec, sorted(listed_managers()))


def get_manager_class(spec: str) -> type[RewardManager]:
    """Resolve ``--manager``: a registered name or alias, an entry point, ``package.module:ClassName``
    or ``path/to/file.py:ClassName``."""
    _load_builtins()
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    eps = _entry_point_classes()
    if spec in eps:
        cls = eps[spec].load()
    elif ":" in spec:
        try:
            cls = import_object(spec, "manager")
        except (ImportError, AttributeError, ValueError, SyntaxError) as exc:
            raise UnknownManagerError(
                f"cannot import manager {spec!r}: {exc}. Check that the module is "
                "importable on the worker (PYTHONPATH) and the class name"
            ) from None
    else:
        raise _unknown(spec, known_managers())
    if not (isinstance(cls, type) and issubclass(cls, RewardManager)):
        raise UnknownManagerError(
            f"{spec!r} is not a subclass of rewardq.reward.RewardManager; a verl reward manager "
            "(RewardManagerBase) runs inside verl's reward loop only: port it by subclassing "
            "rewardq.reward.RewardManager and implementing async run_single(data) (docs/verl-integration.md)"
        )
    return cls


def options_of(spec: str) -> type[ManagerOptions] | None:
    """The options manager ``spec`` declares (:mod:`rewardq.reward.options`), or None. A built-in
    manager's come from :data:`BUILTIN_OPTIONS` without importing it; any other manager is imported."""
    if spec in BUILTIN_NAMES:
        where = BUILTIN_OPTIONS.get(spec)
        if where is None:
            return None
        module, _, name = where.partition(":")
        declared: type[ManagerOptions] = getattr(importlib.import_module(module), name)
        return declared
    return options_class(get_manager_class(spec))


def is_builtin_manager(spec: str) -> bool:
    """Whether ``spec`` names one of rewardq's own managers (its version decides what they do)."""
    return spec in BUILTIN_NAMES
