"""A setting's values: text and config-file values parsed as its type (:func:`parse_text`,
:func:`file_value`), checked against its bounds and choices (:func:`check_bounds`), and layered
with where each came from (:class:`Layers`, the environment's :func:`env_values`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rewardq.errors import ConfigError
from rewardq.settings.declare import Setting, settings_of

#: Words a boolean setting accepts, in any case (environment, config file, the verl adapter's settings).
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
#: Words that set an optional setting to None (environment, config file strings, flags).
NONE_WORDS = ("none", "null")


def parse_bool(text: str) -> bool | None:
    """``text`` as a boolean word (:data:`TRUE_WORDS`, :data:`FALSE_WORDS`), or None when it is neither."""
    word = text.strip().lower()
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


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
