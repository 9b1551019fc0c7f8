"""Reading a worker's config file: rewardq's own keys, verl's whole trainer config, or both.

A config file is YAML (or JSON) holding rewardq keys at top level, or verl's trainer config (its
``reward:`` block and the rest, read as verl reads them: :mod:`rewardq.verl_config`), or both:
rewardq keys beside verl's sections, in a ``rewardq:`` block or in ``reward.rewardq``. Values are
type-checked as environment variables are (:func:`rewardq.settings.file_value`); keys rewardq
does not use are listed, never fatal. :meth:`rewardq.config.WorkerConfig.load` layers what
:func:`read_config_file` returns between the defaults and the environment.

Also here: the Redis URL file (``redis_url_file``), which keeps the password off command lines.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewardq.errors import ConfigError
from rewardq.settings import Layers, Setting, file_value
from rewardq.verl_config import VERL_SECTIONS, is_verl_config, translate

__all__ = ["LoadedFile", "parse_file", "read_config_file", "read_url_file"]


@dataclass
class LoadedFile:
    """A config file's setting values, where in the file each came from, and the keys rewardq
    does not use (dotted paths)."""

    values: dict[str, Any]
    unused: list[str]
    sources: dict[str, str] = field(default_factory=dict)


def parse_file(path: str) -> dict[str, object]:
    """The mapping a YAML/JSON config file holds (ConfigError when it is missing or malformed)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = p.read_text()
    import yaml

    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:  # JSON's errors are ValueErrors; deep nesting
        raise ConfigError(f"cannot parse config file {path}: {exc}") from None
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at top level")
    return data


def read_config_file(path: str, settings: Mapping[str, Setting], skipped: Set[str]) -> LoadedFile:
    """Read a rewardq config file, or verl's trainer config (see :mod:`rewardq.verl_config`).

    ``settings``: the settings the file may set (``WorkerConfig.settings()``); ``skipped``: keys
    that belong to another reader of the same file (the verl adapter's), neither read nor listed.
    Precedence inside one file: what a verl config implies < top-level rewardq keys < a
    top-level ``rewardq:`` block < a ``reward.rewardq`` block. Every value is type-checked
    (:func:`rewardq.settings.file_value`); keys that are neither settings nor verl's are listed in
    :attr:`LoadedFile.unused`, with a suggestion when one looks like a misspelt setting.
    """
    data = parse_file(path)
    known = {s.key: s for s in settings.values()}
    layers: list[tuple[str, Mapping[str, Any]]] = []
    unused: list[str] = []
    origins: dict[str, str] = {}
    verl = is_verl_config(data)
    if verl:
        translated = translate(data)
        layers.append(("verl config", translated.values))
        unused += translated.unused
        origins = translated.origins
    top = {k: v for k, v in data.items() if not (verl and k in VERL_SECTIONS) and k != "rewardq"}
    layers.append(("", top))
    for block_path, block in (("rewardq", data.get("rewardq")), ("reward.rewardq", _reward_block(data))):
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise ConfigError(f"{path}: {block_path} must be a mapping of rewardq settings, got {block!r:.80}")
        layers.append((block_path, block))
    found = Layers()
    for prefix, layer in layers:
        for key, value in layer.items():
            dotted = f"{prefix}.{key}" if prefix and prefix != "verl config" else str(key)
            if key in skipped:
                continue
            if key not in known:
                unused.append(dotted + _suggestion(str(key), known))
                continue
            where = f"{path} ({prefix})" if prefix else path
            if prefix == "verl config" and key in origins:  # the verl key it came from, for errors
                where = f"{path} ({origins[key]})"
            found.put(known[key], file_value(known[key], value, where), f"file {where}")
    return LoadedFile(found.values, unused, found.sources)


def _reward_block(data: Mapping[str, object]) -> object:
    reward = data.get("reward")
    return reward.get("rewardq") if isinstance(reward, Mapping) else None


def _suggestion(key: str, known: Mapping[str, object]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if close else ""


def read_url_file(path: str) -> str:
    """The Redis URL on the first line of ``path``.

    Raises:
        ConfigError: the file cannot be read or its first line is not a URL.
    """
    try:
        with open(path, encoding="utf-8") as f:
            url = f.readline().strip()
    except OSError as exc:
        raise ConfigError(f"redis_url_file {path}: cannot read the Redis URL file ({exc.strerror})") from None
    if "://" not in url:
        raise ConfigError(f"redis_url_file {path}: the file's first line must be a Redis URL (redis://...)")
    return url
