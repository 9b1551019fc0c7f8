"""Command-line options made from setting declarations (:mod:`rewardq.settings`).

:func:`click_options` gives a command one option per setting: the flag the declaration names,
the parameter named as the setting, a type from its annotation (choices, ``--x/--no-x`` for
booleans, repeatable ``KEY=VALUE`` for option dicts, ``none`` for optional values), and a help
line that ends with the default and the environment variable. Every option defaults to None
("not given"), so the environment, the config file and the declared default decide unless the
flag is on the command line (:func:`rewardq.settings.flag_values`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from rewardq.settings import NONE_GIVEN, NONE_WORDS, Setting, settings_of

__all__ = ["SettingOption", "OrNone", "click_options", "setting_option"]

F = TypeVar("F", bound=Callable[..., Any])
if TYPE_CHECKING:
    _ParamType = click.ParamType[Any, Any]
else:  # click before 8.3 has no generic ParamType to subscript at run time
    _ParamType = click.ParamType


class OrNone(_ParamType):
    """A value of ``inner``'s type, or the word ``none`` (the setting set to None)."""

    def __init__(self, inner: click.ParamType[Any, Any]) -> None:
        self.inner = inner
        self.name = inner.name

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        inner = self.inner.get_metavar(param, ctx) or self.inner.name.upper()
        return f"{inner}|none"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        if isinstance(value, str) and value.strip().lower() in NONE_WORDS:
            return NONE_GIVEN
        return self.inner.convert(value, param, ctx)


class SettingOption(click.Option):
    """The option of one setting: its help line ends with ``[default: ...; env: REWARDQ_...]``."""

    def __init__(self, *args: Any, setting: Setting, env_help: bool = True, **kwargs: Any) -> None:
        self.setting = setting
        self.env_help = env_help
        super().__init__(*args, **kwargs)

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None:
            return None
        s = self.setting
        text = s.spec.help + (f" {s.spec.more_help()}" if s.spec.more_help else "")
        env = f"; env: {s.env}" if self.env_help else ""
        return record[0], f"{text}  [default: {s.default_text()}{env}]"


def _param_type(s: Setting) -> click.ParamType[Any, Any]:
    kind: click.ParamType[Any, Any]
    if s.spec.choices:
        kind = click.Choice(list(s.spec.choices), case_sensitive=not s.spec.ignore_case)
    elif s.kind is int:
        kind = click.INT
    elif s.kind is float:
        kind = click.FLOAT
    else:
        kind = click.STRING
    return OrNone(kind) if s.optional and s.kind is not str else kind


def setting_option(s: Setting, **overrides: object) -> Callable[[F], F]:
    """The click option of setting ``s`` (``overrides``: click keyword arguments, e.g. ``envvar``)."""
    names = [s.flag, *s.spec.aliases]
    kwargs: dict[str, Any] = {"default": None, "help": s.spec.help, "cls": SettingOption, "setting": s}
    if s.spec.metavar:
        kwargs["metavar"] = s.spec.metavar
    if s.kind is bool:
        names = [f"{s.flag}/--no-{s.flag[2:]}"]
    elif s.spec.pairs:
        kwargs.update(multiple=True, default=())
    else:
        kwargs["type"] = _param_type(s)
    kwargs.update(overrides)
    option: Callable[[F], F] = click.option(*names, s.name, **kwargs)
    return option


def click_options(cls: type, *, only: Iterable[str] | None = None, leave_out: Iterable[str] = ()) -> Callable[[F], F]:
    """A decorator adding :func:`setting_option` for each setting of ``cls``, in declaration order
    (``only``: these settings alone, in this order; ``leave_out``: all but these)."""
    known = settings_of(cls)
    chosen = [n for n in (list(only) if only is not None else list(known)) if n not in set(leave_out)]

    def decorate(f: F) -> F:
        for name in reversed(chosen):
            f = setting_option(known[name])(f)
        return f

    return decorate
