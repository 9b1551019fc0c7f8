"""What settings given as command-line flags mean (:func:`flag_values`), and the flags that give them
again (:func:`flag_argv`). No click here: the click options, with their ``--help`` lines, are
:mod:`rewardq.ops.flags`'s."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from rewardq.errors import ConfigError
from rewardq.settings.declare import settings_of


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
