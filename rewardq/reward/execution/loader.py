"""Load a custom scoring function: verl's ``custom_reward_function`` as one string.

``--reward-fn`` (and :func:`load_score_fn`) accepts four spellings::

    path/to/reward.py:my_score      # a file and a function in it
    path/to/reward.py               # a file; the function is ``compute_score``
    my_pkg.rewards:my_score         # an importable module and a function
    my_pkg.rewards                  # an importable module; the function is ``compute_score``

verl's ``custom_reward_function: {path, name, reward_kwargs}`` maps to
``load_score_fn(f"{path}:{name}", reward_kwargs)``. The function is called as
``f(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)``
and may be sync or async; it returns a number or a dict with ``"score"``.

Everything that can be checked before the first sample is checked at load time: the
file or module exists and imports, the name exists and is callable, and its signature
accepts the four scoring keywords plus every configured keyword. Each failure is a
:class:`~rewardq.errors.ConfigError` that says what to fix.

A file is imported under a module name derived from its absolute path
(``rewardq_reward_fn_<stem>_<hash>``) and registered in ``sys.modules``, so two files
both called ``reward.py`` never collide, and loading the same file twice gives the
same module name (which keeps the function importable by reference in worker
processes started by fork).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from rewardq.errors import ConfigError

logger = logging.getLogger("rewardq.reward")

DEFAULT_FUNCTION = "compute_score"
#: Start of the module names reward files are imported under (see :func:`module_name_for`).
FILE_MODULE_PREFIX = "rewardq_reward_fn_"
#: The keywords every manager passes; configured kwargs may not override them.
SCORING_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def load_score_fn(spec: str | None, kwargs: dict[str, object] | None = None) -> Callable[..., Any] | None:
    """Resolve ``spec`` to a scoring function with ``kwargs`` bound.

    Args:
        spec: ``FILE.py[:FUNC]`` or ``package.module[:FUNC]`` (FUNC defaults to
            ``compute_score``); None or ``""`` means "use the default scorer".
        kwargs: extra keyword arguments for every call (verl's ``reward_kwargs``).

    Returns:
        The function, or None when ``spec`` is empty. With ``kwargs``, a sync function
        comes back as a ``functools.partial`` and an async one as an ``async def``
        wrapper, so :func:`is_async_callable` still tells them apart.

    Raises:
        ConfigError: the file/module/function is missing or unusable, or the kwargs
            do not fit the function.

    Example::

        >>> fn = load_score_fn("examples/reward.py:score", {"penalty": 0.1})
        >>> fn(data_source="x", solution_str="...", ground_truth="4", extra_info={})
    """
    kwargs = dict(kwargs or {})
    if not spec:
        if kwargs:
            raise ConfigError(
                f"reward function kwargs {sorted(kwargs)} were given without a reward function; "
                "set --reward-fn FILE_OR_MODULE:FUNC or drop the kwargs"
            )
        return None
    if not isinstance(spec, str):
        raise ConfigError(f"the reward function must be given as a string, got {type(spec).__name__}")
    target, func_name = split_spec(spec)
    module = _load_file(target) if _looks_like_file(target) else _load_module(target)
    fn = _get_function(module, func_name, spec)
    _check_kwargs(fn, kwargs, spec)
    return bind_kwargs(fn, kwargs)


def split_spec(spec: str) -> tuple[str, str]:
    """``"a/b.py:f"`` → ``("a/b.py", "f")``; ``"pkg.mod"`` → ``("pkg.mod", "compute_score")``.

    Only a valid Python name after the last ``:`` is taken as the function, so a
    Windows path such as ``C:\\rewards\\r.py`` keeps its drive letter.
    """
    spec = spec.strip()
    head, sep, tail = spec.rpartition(":")
    if sep and head and _IDENTIFIER.match(tail):
        return head, tail
    if sep and not tail:
        raise ConfigError(
            f"reward function {spec!r} ends with ':'; write FILE_OR_MODULE:FUNC or leave the "
            f"':FUNC' off to use {DEFAULT_FUNCTION!r}"
        )
    return spec, DEFAULT_FUNCTION


def bind_kwargs(fn: Callable[..., Any], kwargs: Mapping[str, object]) -> Callable[..., Any]:
    """Bind ``kwargs`` to ``fn`` without hiding whether it is async.

    Keywords given at call time win over the bound ones, as with ``functools.partial``.
    """
    if not kwargs:
        return fn
    if is_async_callable(fn):

        @functools.wraps(fn)
        async def bound(*args: object, **call_kwargs: object) -> Any:
            return await fn(*args, **{**kwargs, **call_kwargs})

        setattr(bound, "keywords", dict(kwargs))  # noqa: B010 - like functools.partial.keywords; mypy sees no such attribute
        return bound
    return functools.partial(fn, **kwargs)


def _looks_like_file(target: str) -> bool:
    return target.endswith(".py") or os.sep in target or "/" in target or os.path.isfile(target)


def module_name_for(path: str) -> str:
    """The ``sys.modules`` name a reward file is imported under (stable per absolute path)."""
    path = os.path.realpath(path)
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0]) or "file"
    digest = hashlib.sha1(path.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{FILE_MODULE_PREFIX}{stem}_{digest}"


def import_file_as(path: str, name: str) -> ModuleType | None:
    """Run the Python file ``path`` as the module ``name``, registered in ``sys.modules`` (and
    taken out again if running it raises); None if ``path`` cannot be imported as Python."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _load_file(path: str) -> ModuleType:
    expanded = os.path.expanduser(path)
    if not os.path.exists(expanded):
        raise ConfigError(
            f"reward function file {path!r} does not exist (looked in {os.path.abspath(expanded)!r}); "
            "give a path to a .py file, relative to the worker's working directory or absolute"
        )
    if not os.path.isfile(expanded):
        raise ConfigError(f"reward function path {path!r} is a directory; give the .py file inside it")
    name = module_name_for(expanded)
    try:
        module = import_file_as(expanded, name)
    except Exception as exc:
        raise ConfigError(f"importing reward function file {path!r} failed: {type(exc).__name__}: {exc}") from exc
    if module is None:
        raise ConfigError(f"cannot import {path!r} as Python; the reward function file must be a .py file")
    logger.debug("loaded reward function file %s as module %s", expanded, name)
    return module


def _load_module(name: str) -> ModuleType:
    if not _IDENTIFIER.match(name):
        raise ConfigError(
            f"reward function {name!r} is neither an existing .py file nor a module name "
            "like package.module; give FILE.py[:FUNC] or package.module[:FUNC]"
        )
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise ConfigError(
                f"no module named {name!r} for the reward function; install the package that "
                "provides it on the worker or add its folder to PYTHONPATH, or give a .py file "
                "path"
            ) from None
        raise ConfigError(f"importing reward function module {name!r} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigError(f"importing reward function module {name!r} failed: {type(exc).__name__}: {exc}") from exc


def _get_function(module: ModuleType, func_name: str, spec: str) -> Callable[..., object]:
    try:
        fn = functools.reduce(getattr, func_name.split("."), module)
    except AttributeError:
        available = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        hint = f"; functions defined there: {', '.join(available)}" if available else ""
        raise ConfigError(
            f"reward function {spec!r}: {module.__name__!r} has no attribute {func_name!r}{hint}"
        ) from None
    if not callable(fn):
        raise ConfigError(f"reward function {spec!r}: {func_name!r} is a {type(fn).__name__}, not a function")
    return fn


def _check_kwargs(fn: Callable[..., object], kwargs: dict[str, object], spec: str) -> None:
    bad_keys = [k for k in kwargs if not isinstance(k, str)]
    if bad_keys:
        raise ConfigError(f"reward function kwargs must have string keys, got {bad_keys!r}")
    reserved = sorted(set(kwargs) & set(SCORING_KEYWORDS))
    if reserved:
        raise ConfigError(
            f"reward function kwargs may not set {reserved}: the manager passes "
            f"{', '.join(SCORING_KEYWORDS)} for every sample"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and some C callables have no signature; the first call will tell
    probe = dict.fromkeys(SCORING_KEYWORDS)
    try:
        signature.bind_partial(**probe, **kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"reward function {spec!r} has signature {signature}, which cannot take "
            f"{', '.join(list(SCORING_KEYWORDS) + sorted(kwargs))} as keywords ({exc}). It is "
            "called as f(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)"
        ) from None


def is_async_callable(fn: object) -> bool:
    """True for ``async def`` functions and for objects whose ``__call__`` is one."""
    call = type(fn).__call__ if not inspect.isroutine(fn) and callable(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def import_object(spec: str, what: str = "object") -> object:
    """Import ``package.module:attr`` or ``path/to/file.py:attr`` (``attr`` may be dotted)."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form package.module:Name or path/to/file.py:Name")
    module = _import_file(module_name) if is_file_spec(module_name) else importlib.import_module(module_name)
    obj: object = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def is_file_spec(target: str) -> bool:
    """Whether the module part of a spec names a file (``a/b.py``) rather than a module."""
    return target.endswith(".py") or "/" in target or os.sep in target


def _import_file(path: str) -> ModuleType:
    """Import a file once, under the stable name :func:`module_name_for` gives it."""
    expanded = os.path.expanduser(path)
    if not os.path.isfile(expanded):
        raise ImportError(f"no such file {path!r} (looked in {os.path.abspath(expanded)!r})")
    name = module_name_for(expanded)
    if name in sys.modules:
        return sys.modules[name]
    module = import_file_as(expanded, name)
    if module is None:
        raise ImportError(f"{path!r} is not a Python file")
    return module
