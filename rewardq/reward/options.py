"""A manager's options, declared like the worker's settings: one declaration each, checked in one place.

A manager that declares its options gives its class an ``Options`` dataclass, a subclass of
:class:`ManagerOptions` whose fields are declared with :func:`option`: the field's annotation is the
type, and the declaration gives the default, the help line, the bounds or choices, and whether the
value is a credential. From that one declaration come

* the checks every value passes, whichever door it came through (``--manager-option``, a config
  file's ``manager_options``, verl's reward block, or a test's keyword arguments):
  :meth:`ManagerOptions.from_mapping` refuses an unknown option naming the known ones, parses a
  string as the declared type (``timeout: "30"`` is 30.0), and checks the bounds with the worker
  settings' own :func:`~rewardq.settings.check_bounds`;
* what ``rewardq config`` shows: every option with its value and where it came from
  (:func:`option_rows`; a credential as ``***``, and a value that merely looks like one masked, as
  :func:`~rewardq.reward.credentials.shown_value` shows it);
* what the scoring fingerprint counts: a credential counts as ``***`` whatever its value
  (:func:`secret_option_names`).

What an option means for scoring (a URL's form, two options that exclude each other) stays in
the manager; a bound or a choice is in the declaration and nowhere else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from rewardq.errors import ConfigError
from rewardq.reward.credentials import shown_value
from rewardq.settings import Setting, check_bounds, file_value, setting, settings_of

__all__ = ["ManagerOptions", "option", "options_class", "option_rows", "secret_option_names", "SECRET_SHOWN"]

T = TypeVar("T")
OptionsT = TypeVar("OptionsT", bound="ManagerOptions")

#: What a credential option shows as (``rewardq config``, the fingerprint).
SECRET_SHOWN = "***"


def option(
    default: T,
    help: str,
    *,
    choices: tuple[str, ...] = (),
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    bound_why: str = "",
    secret: bool = False,
) -> T:
    """Declare one manager option as a field of a :class:`ManagerOptions` dataclass (see the module
    docstring); the arguments mean what they mean for :func:`rewardq.settings.setting`."""
    return setting(
        default,
        help,
        choices=choices,
        minimum=minimum,
        above=above,
        maximum=maximum,
        bound_why=bound_why,
        secret=secret,
    )


@dataclass(frozen=True)
class ManagerOptions:
    """The options of one manager (subclass it with :func:`option` fields; see the module docstring).

    Every instance is checked against the declarations when it is made, however it is made
    (:meth:`from_mapping` or the constructor); a subclass that checks more (a URL's form) does so
    in its own ``__post_init__`` after calling this one.
    """

    #: Who takes these options, in errors (``manager 'disrm': ...``); empty: the option alone.
    manager: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for name, s in self.declared().items():
            if s.kind not in (object, list):
                with self._said():
                    check_bounds(s, getattr(self, name))

    @classmethod
    def declared(cls) -> dict[str, Setting]:
        """Every declared option, in declaration order."""
        return settings_of(cls)

    @classmethod
    def from_mapping(cls: type[OptionsT], given: Mapping[str, object]) -> OptionsT:
        """The options ``given`` (name -> value) on top of the defaults, each parsed as its declared
        type (a string as a number, say) and checked.

        Raises:
            ConfigError: an unknown option (naming the known ones), a value of the wrong type, or
                one out of its bounds; the message names the option (and the manager).
        """
        declared = cls.declared()
        unknown = sorted(set(map(str, given)) - set(declared))
        if unknown:
            who = f"manager {cls.manager!r}" if cls.manager else cls.__name__
            raise ConfigError(f"{who} does not take option {unknown[0]!r}; it takes {sorted(declared)}")
        values: dict[str, Any] = {}
        for name, raw in given.items():
            s = declared[str(name)]
            with cls._said():
                values[str(name)] = raw if s.kind in (object, list) else _parsed(s, raw)
        return cls(**values)

    @classmethod
    def _prefix(cls) -> str:
        return f"manager {cls.manager!r}: " if cls.manager else ""

    @classmethod
    @contextlib.contextmanager
    def _said(cls) -> Iterator[None]:
        """A ConfigError raised inside, said for this manager."""
        try:
            yield
        except ConfigError as exc:
            raise ConfigError(f"{cls._prefix()}{exc}") from None

    def given(self) -> dict[str, object]:
        """The options whose value is not the declared default."""
        declared = self.declared()
        return {name: getattr(self, name) for name, s in declared.items() if getattr(self, name) != s.default}


def _parsed(s: Setting, raw: object) -> object:
    """``raw`` as the option's declared type (see :func:`rewardq.settings.file_value`), its error
    naming the option alone."""
    if s.kind is str and s.spec.choices and isinstance(raw, bool):  # YAML's true for the word "true"
        raw = "true" if raw else "false"
    try:
        return file_value(s, raw, "@")
    except ConfigError as exc:
        raise ConfigError(str(exc).removeprefix("@: ")) from None


def options_class(manager_cls: type) -> type[ManagerOptions] | None:
    """The ``Options`` a manager class declares, or None (its constructor's keywords are its options)."""
    declared = getattr(manager_cls, "Options", None)
    return declared if isinstance(declared, type) and issubclass(declared, ManagerOptions) else None


def secret_option_names(declared: type[ManagerOptions] | None) -> frozenset[str]:
    """The options ``declared`` marks as credentials (none without a declaration)."""
    if declared is None:
        return frozenset()
    return frozenset(name for name, s in declared.declared().items() if s.spec.secret)


def option_rows(
    declared: type[ManagerOptions] | None,
    given: Mapping[str, object],
    source: str,
    key_sources: Mapping[str, str] | None = None,
) -> list[dict[str, object]]:
    """One row per option ``declared``: ``name`` (``manager_options.<option>``), ``value`` (a
    credential as ``***``, a value that looks like one masked), ``source`` (for an option given, the
    layer that set it, from ``key_sources``, else ``source``; ``default`` for one not given) and
    ``help``. Without a declaration (a manager that declares none): the
    options given, with values that look like credentials masked."""

    def of(name: str) -> str:
        return (key_sources or {}).get(name, source)

    if declared is None:
        return [
            {"name": f"manager_options.{k}", "value": shown_value(v), "source": of(k), "help": ""}
            for k, v in sorted(given.items())
        ]
    try:
        checked = declared.from_mapping(given)
        parsed: Mapping[str, object] = {name: getattr(checked, name) for name in declared.declared()}
    except ConfigError:  # shown as given; the worker refuses them with the reason
        parsed = given
    rows = []
    for name, s in declared.declared().items():
        value = parsed.get(name, s.default)
        value = SECRET_SHOWN if s.spec.secret and value is not None else shown_value(value)
        rows.append(
            {
                "name": f"manager_options.{name}",
                "value": value,
                "source": of(name) if name in given else "default",
                "help": s.spec.help,
            }
        )
    return rows
