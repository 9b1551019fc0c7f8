"""What a setting's declaration is: :func:`setting` makes a dataclass field of it, :class:`Setting`
is that declaration read back with every name it goes by (:func:`settings_of`), and :func:`same_as`
lets a second settings class read one setting the first declares."""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

#: The prefix of every setting's environment variable (``REWARDQ_<NAME>``).
ENV_PREFIX = "REWARDQ_"
_METADATA_KEY = "rewardq.setting"

T = TypeVar("T")


@dataclass(frozen=True)
class Spec:
    """What a declaration says besides the type and the default (see :func:`setting`)."""

    help: str
    flag: str | None = None
    key: str | None = None
    env: str | None = None
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    ignore_case: bool = False
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    bound_why: str = ""
    shown_default: str | None = None
    pairs: bool = False
    merge: bool = False
    metavar: str | None = None
    passed_to: str | None = None
    more_help: Callable[[], str] | None = None
    secret: bool = False


def setting(
    default: T,
    help: str,
    *,
    flag: str | None = None,
    key: str | None = None,
    env: str | None = None,
    aliases: tuple[str, ...] = (),
    choices: tuple[str, ...] = (),
    ignore_case: bool = False,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    bound_why: str = "",
    shown_default: str | None = None,
    pairs: bool = False,
    merge: bool = False,
    metavar: str | None = None,
    passed_to: str | None = None,
    more_help: Callable[[], str] | None = None,
    secret: bool = False,
) -> T:
    """Declare one setting as a dataclass field (the annotation is its type).

    Args:
        default: the value when no layer sets it (a dict is copied for each instance).
        help: one sentence for ``--help``; the default and the variable are added to it.
        flag: the flag, when it is not ``--<name-with-dashes>``; ``aliases``: further spellings.
        key, env: the config-file key and the environment variable, when they are not ``<name>``
            and ``REWARDQ_<NAME>`` (the flag then follows the key).
        choices: the words it accepts (``ignore_case``: in any case, stored as spelt here).
        minimum, above, maximum: bounds (``above`` is exclusive); ``bound_why`` says why, in errors.
        shown_default: what ``--help`` says the default is, when the value (None) means something
            computed, e.g. "one per core".
        pairs: a dict given on the command line as repeatable ``KEY=VALUE`` (else as one JSON object).
        merge: a dict whose layers merge key by key instead of the higher replacing the lower.
        metavar: the flag's placeholder in ``--help``.
        passed_to: the component that takes it as a keyword argument of the same name (e.g.
            ``"broker"``: :func:`rewardq.config.WorkerConfig.arguments_for`).
        more_help: called when ``--help`` is shown, its text appended (lists that are found at run
            time, e.g. the installed managers).
        secret: the value is a credential: shown and fingerprinted as ``***``.
    """
    spec = Spec(
        help=help,
        flag=flag,
        key=key,
        env=env,
        aliases=aliases,
        choices=choices,
        ignore_case=ignore_case,
        minimum=minimum,
        above=above,
        maximum=maximum,
        bound_why=bound_why,
        shown_default=shown_default,
        pairs=pairs,
        merge=merge,
        metavar=metavar,
        passed_to=passed_to,
        more_help=more_help,
        secret=secret,
    )
    return cast(T, _field(default, spec))


def _field(default: object, spec: Spec) -> object:
    """The dataclass field of a declaration (a dict default is copied for each instance)."""
    metadata = {_METADATA_KEY: spec}
    if isinstance(default, dict):
        template = dict(default)
        return dataclasses.field(default_factory=lambda: dict(template), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Setting:
    """One declared setting, with every name it goes by.

    Attributes:
        name: the field (and config-file key).
        kind: ``str``, ``int``, ``float``, ``bool`` or ``dict``.
        optional: None is a valid value (the annotation includes ``None``).
        default: the declared default.
        spec: the rest of the declaration.
    """

    name: str
    kind: type
    optional: bool
    default: object
    spec: Spec

    @property
    def key(self) -> str:
        """Its key in a config file (and the name its errors give it)."""
        return self.spec.key or self.name

    @property
    def env(self) -> str:
        """Its environment variable."""
        return self.spec.env or ENV_PREFIX + self.key.upper()

    @property
    def flag(self) -> str:
        """Its command-line flag (the main spelling)."""
        return self.spec.flag or "--" + self.key.replace("_", "-")

    def default_text(self) -> str:
        """The default as ``--help`` shows it."""
        if self.spec.shown_default is not None:
            return self.spec.shown_default
        value = self.default
        if self.kind is bool:
            return "on" if value else "off"
        if value is None:
            return "none"
        if self.kind is float and isinstance(value, float) and value.is_integer():
            return str(int(value))
        if self.kind is dict:
            return json.dumps(value) if value else "none"
        return str(value)


def same_as(cls: type, name: str) -> Any:
    """A field declared as ``cls``'s setting ``name`` is (the same default, help, bounds and names):
    one setting read by two settings classes, e.g. the worker's and the verl adapter's ``redis_url``."""
    s = settings_of(cls)[name]
    return _field(s.default, s.spec)


def settings_of(cls: type) -> dict[str, Setting]:
    """The declared settings of a settings dataclass, in declaration order."""
    return dict(_settings_of(cls))


@functools.cache
def _settings_of(cls: type) -> tuple[tuple[str, Setting], ...]:
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, Setting]] = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_METADATA_KEY)
        if spec is None:
            continue
        kind, optional = _base_type(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"setting {cls.__name__}.{f.name} has no default")
        out.append((f.name, Setting(f.name, kind, optional, default, spec)))
    return tuple(out)


def _base_type(hint: object) -> tuple[type, bool]:
    """``int | None`` -> ``(int, True)``; ``dict[str, Any]`` -> ``(dict, False)``."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if args and origin is not dict:
        non_none = [a for a in args if a is not type(None)]
        base = typing.get_origin(non_none[0]) or non_none[0]
        return cast(type, base), len(non_none) < len(args)
    return cast(type, origin or hint), False
