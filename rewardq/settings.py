"""One declaration per setting, and every door into it derived from that declaration.

A setting is a field of a settings dataclass (:class:`rewardq.config.WorkerConfig`) declared with
:func:`setting`: its type is the field's annotation, and the declaration gives its default, its
help text and, where they apply, bounds, choices and another flag spelling. From it come

* the environment variable ``REWARDQ_<NAME>`` (:func:`env_values`);
* the config-file key ``<name>`` (:func:`file_value` checks what a YAML/JSON file holds;
  :mod:`rewardq.config_file` reads the file, verl's trainer config included);
* the command-line flag ``--<name-with-dashes>`` with its ``--help`` line showing the default and
  the variable (:mod:`rewardq.ops.flags`), what given flags mean (:func:`flag_values`) and the
  flags that reproduce them (:func:`flag_argv`);
* the checks every value passes, whichever layer it came from (:func:`check_bounds`);
* where each value came from (:class:`Layers`), which ``rewardq config`` prints.

So a new setting is one :func:`setting` line in :class:`~rewardq.config.WorkerConfig`.

Why a dataclass with field metadata, not pydantic-settings or msgspec: the core install is
redis, msgpack and numpy, and the worker extra must go into a verl 0.9.1 environment without
adding or moving a package. verl's environment has pydantic but not pydantic-settings, and
msgspec arrives there only with transferqueue, so either would be a new dependency for every
verl user. What the settings need (five scalar kinds plus JSON objects, bounds, choices, layered
sources) fits in this module, and the settings stay plain dataclasses that code, tests and
benchmarks construct directly, with static types mypy checks.

The command-line half (click options, ``--help`` lines) is :mod:`rewardq.ops.flags`: this module
imports nothing beyond the standard library and :mod:`rewardq.errors`, so the producer side (no
worker extra, no click) can import :mod:`rewardq.config`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from rewardq.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "NONE_WORDS",
    "Setting",
    "Spec",
    "Layers",
    "setting",
    "settings_of",
    "same_as",
    "parse_bool",
    "parse_text",
    "file_value",
    "check_bounds",
    "choice_of",
    "env_values",
    "flag_values",
    "flag_argv",
    "parse_pairs",
]

ENV_PREFIX = "REWARDQ_"
#: Words a boolean setting accepts, in any case (environment, config file, the verl adapter's settings).
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
#: Words that set an optional setting to None (environment, config file strings, flags).
NONE_WORDS = ("none", "null")
_METADATA_KEY = "rewardq.setting"

T = TypeVar("T")


def parse_bool(text: str) -> bool | None:
    """``text`` as a boolean word (:data:`TRUE_WORDS`, :data:`FALSE_WORDS`), or None when it is neither."""
    word = text.strip().lower()
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


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


# -- values: parsing and checking ---------------------------------------------------------------


def parse_text(s: Setting, raw: str, where: str) -> object:
    """A string (an environment variable, a string in a config file) as the setting's type.

    ``where`` names the source in the error, e.g. ``REWARDQ_CONCURRENCY='many'``.
    """
    try:
        if s.optional and raw.strip().lower() in ("", *NONE_WORDS):
            return None
        if s.kind is bool:
            flag = parse_bool(raw) if raw.strip() else False
            if flag is None:
                raise ValueError("expected true/false, yes/no, on/off or 1/0")
            return flag
        if s.kind is int:
            return int(raw)
        if s.kind is float:
            return float(raw)
        if s.kind is dict:
            value = json.loads(raw)
            if not isinstance(value, dict):
                raise ValueError("not a JSON object")
            return value
    except ValueError as exc:
        raise ConfigError(f"{where} is not a valid {s.kind.__name__} ({exc})") from None
    return raw  # choices are checked with the other bounds (check_bounds), naming the source


def file_value(s: Setting, value: Any, where: str) -> object:
    """A config-file value, checked like an environment variable: strings are parsed
    (``cluster: "false"`` is False), numbers must be numbers, and a ``bool`` is not an ``int``."""
    if isinstance(value, str):
        return parse_text(s, value, f"{where}: {s.key}={value!r}")
    if value is None and s.optional:
        return None
    kind = s.kind
    ok = (
        (kind is bool and isinstance(value, bool))
        or (kind is int and isinstance(value, int) and not isinstance(value, bool))
        or (kind is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (kind is dict and isinstance(value, Mapping))
    )
    if not ok:
        raise ConfigError(f"{where}: {s.key} must be a {kind.__name__}, got {type(value).__name__} {value!r:.80}")
    if kind is float:
        return float(value)
    return dict(value) if kind is dict else value


def choice_of(s: Setting, text: str, source: str = "") -> str:
    """``text`` as one of the setting's choices, spelt as declared (ConfigError when it is none)."""
    for choice in s.spec.choices:
        if text == choice or (s.spec.ignore_case and text.lower() == choice.lower()):
            return choice
    at = f" (from {source})" if source and source != "default" else ""
    why = f" ({s.spec.bound_why})" if s.spec.bound_why else ""
    raise ConfigError(f"{s.key} must be {_words(s.spec.choices)}, got {text!r}{at}{why}")


def _words(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def check_bounds(s: Setting, value: Any, source: str = "") -> None:
    """Raise ConfigError, naming the setting (and ``source``), when ``value`` is out of its bounds."""
    if value is None and s.optional:
        return
    at = f" (from {source})" if source and source != "default" else ""
    if s.spec.choices:
        choice_of(s, str(value), source)
    if s.kind is str and not s.optional and not (isinstance(value, str) and value.strip()):
        raise ConfigError(f"{s.key} must be a non-empty string, got {value!r}{at}")
    spec = s.spec
    if s.kind not in (int, float) or (spec.minimum is None and spec.above is None and spec.maximum is None):
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if s.kind is int and not isinstance(value, int):
        number = False
    low_ok = number and (spec.minimum is None or value >= spec.minimum) and (spec.above is None or value > spec.above)
    high_ok = number and (spec.maximum is None or value <= spec.maximum)
    if low_ok and high_ok:
        return
    what = "an integer" if s.kind is int else "a number"
    if spec.maximum is not None:
        low = spec.minimum if spec.minimum is not None else spec.above
        rule = f"{what} from {_num(low)} to {_num(spec.maximum)}"
    elif spec.above == 0:
        rule = f"a positive {'integer' if s.kind is int else 'number'}"
    elif spec.minimum == 0:
        rule = f"a non-negative {'integer' if s.kind is int else 'number'}"
    elif spec.above is not None:
        rule = f"{what} > {_num(spec.above)}"
    else:
        rule = f"{what} >= {_num(spec.minimum)}"
    why = f" ({spec.bound_why})" if spec.bound_why else ""
    raise ConfigError(f"{s.key} must be {rule}, got {value!r}{at}{why}")


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:g}"


# -- layers -----------------------------------------------------------------------------------


@dataclass
class Layers:
    """Values from the layers seen so far, lowest first, and where each one came from.

    Attributes:
        values: setting name -> value.
        sources: setting name -> where its value came from (``default`` when no layer set it;
            merged dicts name every layer that contributed, joined by ``" + "``, and each key of
            one is sourced on its own, as ``<setting>.<key>``: the layer that set it last).
    """

    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)

    def put(self, s: Setting, value: object, source: str) -> None:
        """Set ``s`` from a higher layer (a merged dict merges into what the lower layers gave)."""
        if s.spec.merge and isinstance(self.values.get(s.name), dict) and isinstance(value, Mapping):
            self.values[s.name] = {**self.values[s.name], **value}
            self.sources[s.name] = f"{self.sources[s.name]} + {source}"
        else:
            if s.spec.merge:  # a layer that replaces the whole dict: its keys' own sources go with it
                for key in [k for k in self.sources if k.startswith(f"{s.name}.")]:
                    del self.sources[key]
            self.values[s.name] = dict(value) if isinstance(value, Mapping) else value
            self.sources[s.name] = source
        if s.spec.merge and isinstance(value, Mapping):
            self.sources.update({f"{s.name}.{key}": source for key in value})

    def update(self, cls: type, values: Mapping[str, object], source: str) -> None:
        """:meth:`put` each of ``values`` (setting name -> value), all from ``source``."""
        known = settings_of(cls)
        for name, value in values.items():
            self.put(known[name], value, source)


def env_values(cls: type, env: Mapping[str, str], *, skip_empty: bool = False) -> dict[str, tuple[object, str]]:
    """The ``REWARDQ_*`` variables that name a setting of ``cls``: name -> (value, variable)
    (``skip_empty``: a variable set to the empty string counts as not set)."""
    out: dict[str, tuple[Any, str]] = {}
    for name, s in settings_of(cls).items():
        raw = env.get(s.env)
        if raw is not None and not (skip_empty and raw == ""):
            out[name] = (parse_text(s, raw, f"{s.env}={raw!r}"), s.env)
    return out


# -- the command line ---------------------------------------------------------------------------


class _NoneGiven:
    """What a flag returns for ``none``: the setting is set to None (click's None means "not given")."""

    def __repr__(self) -> str:
        return "none"


NONE_GIVEN: object = _NoneGiven()


def parse_pairs(flag: str, items: Iterable[str]) -> dict[str, object]:
    """``("max_rpm=60", "overlong_buffer.enable=true")`` -> ``{"max_rpm": 60, "overlong_buffer": {"enable": True}}``.

    Values are JSON when they parse as JSON (numbers, booleans, lists, objects, ``null``),
    otherwise plain strings. Dots in a key build nested dicts.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r} is not KEY=VALUE (e.g. {flag} max_rpm=60)")
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{flag} {item!r}: {p!r} was already given a plain value")
            node = child
        node[leaf] = _json_or_str(raw)
    return out


def _json_or_str(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def flag_values(cls: type, params: Mapping[str, Any]) -> dict[str, tuple[object, str]]:
    """The settings given as flags: name -> (value, flag). ``params`` are click's (None: not given)."""
    out: dict[str, tuple[Any, str]] = {}
    for name, s in settings_of(cls).items():
        raw = params.get(name)
        if raw is None or (s.spec.pairs and not raw):
            continue
        if raw is NONE_GIVEN:
            value: object = None
        elif s.kind is dict and s.spec.pairs:
            value = parse_pairs(s.flag, raw)
        elif s.kind is dict:
            try:
                value = json.loads(raw)
            except ValueError as exc:
                raise ConfigError(f"{s.flag} must be a JSON object, e.g. '{{\"penalty\": 0.1}}' ({exc})") from None
            if not isinstance(value, dict):
                raise ConfigError(f"{s.flag} must be a JSON object, got {type(value).__name__}")
        else:
            value = raw
        out[name] = (value, s.flag)
    return out


def flag_argv(cls: type, params: Mapping[str, Any], *, leave_out: Iterable[str] = ()) -> list[str]:
    """The flags that reproduce the settings given in ``params`` (click's values, None: not given)."""
    argv: list[str] = []
    skip = set(leave_out)
    for name, s in settings_of(cls).items():
        raw = params.get(name)
        if raw is None or name in skip:
            continue
        if s.kind is bool:
            argv.append(s.flag if raw else "--no-" + s.flag[2:])
        elif s.spec.pairs:
            for item in raw:
                argv += [s.flag, str(item)]
        else:
            argv += [s.flag, "none" if raw is NONE_GIVEN else str(raw)]
    return argv
