"""A fingerprint of what decides a reward, so one namespace is served by one scoring configuration.

:func:`scoring_fingerprint` reads a worker's configuration and returns a :class:`ScoringFingerprint`:
``digest``, 16 hex characters of SHA-256 over the parts below, and ``text``, the same parts as one
readable line (``manager=naive options={} reward_fn=... tokenizer=... rewardq=0.1.0``).

The parts are what changes a reward and nothing else:

* ``manager``: the ``--manager`` spec; for ``FILE.py:Class`` the file's name, the class and the
  SHA-256 of the file's content (not its path: the same file in another folder is the same
  manager); for ``package.module:Class`` the spec and the digest of the module's source file;
* ``options``: ``--manager-option`` values, as canonical JSON;
* ``reward_fn``: the file's content digest and the function name (or the module, its source
  digest and the function), and its keyword arguments;
* ``tokenizer``: the vocabulary hash and size of :func:`~rewardq.reward.fingerprint.tokenizer_fingerprint`
  (its ``name=`` part is a path, left out);
* ``rewardq``: the installed version, which decides the built-in managers and scorers.

Nothing that differs between two processes of one fleet goes in: no worker name, port, config-file
path or folder. Option values whose key names a secret (``api_key``, ``token``, ``password``,
``secret``, ``auth``) are replaced by ``***`` in both the digest and the text, so a rotated key is
the same configuration and no secret reaches ``<ns>:meta`` or a log.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from rewardq.reward.execution.loader import split_spec

#: Longest ``text`` of a fingerprint, in characters (it is shown in errors and ``rewardq status``).
MAX_TEXT_CHARS = 600
#: Option and keyword-argument names whose values are secrets (matched anywhere in the name, any case).
SECRET_NAMES = re.compile(r"key|token|secret|password|passwd|auth", re.IGNORECASE)


@dataclass(frozen=True)
class ScoringFingerprint:
    """``digest`` (16 hex characters) identifies the configuration; ``text`` describes it."""

    digest: str
    text: str


def scoring_fingerprint(cfg: Any, tokenizer_fingerprint: str | None) -> ScoringFingerprint:
    """The fingerprint of the scoring configuration of ``cfg`` (a :class:`~rewardq.config.WorkerConfig`)
    with the tokenizer whose :func:`~rewardq.reward.fingerprint.tokenizer_fingerprint` is given."""
    from rewardq import __version__

    parts: dict[str, Any] = {
        "manager": _code_spec(cfg.manager, default_name=None),
        "options": _masked(cfg.manager_options or {}),
        "reward_fn": _code_spec(cfg.reward_fn, default_name="compute_score") if cfg.reward_fn else None,
        "reward_kwargs": _masked(cfg.reward_fn_kwargs or {}),
        "tokenizer": _vocabulary_part(tokenizer_fingerprint),
        "rewardq": __version__,
    }
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return ScoringFingerprint(digest, describe(parts))


def describe(parts: dict[str, Any]) -> str:
    """One readable line of the parts, cut to :data:`MAX_TEXT_CHARS`."""
    words = [f"manager={parts['manager']}"]
    if parts["options"]:
        words.append(f"options={_json(parts['options'])}")
    words.append(f"reward_fn={parts['reward_fn'] or 'default'}")
    if parts["reward_kwargs"]:
        words.append(f"reward_kwargs={_json(parts['reward_kwargs'])}")
    words += [f"tokenizer={parts['tokenizer']}", f"rewardq={parts['rewardq']}"]
    text = " ".join(words)
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 3] + "..."


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _masked(value: Any) -> Any:
    """``value`` with every secret-named key's value replaced by ``***`` (nested dicts and lists too)."""
    if isinstance(value, dict):
        return {str(k): "***" if SECRET_NAMES.search(str(k)) else _masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_masked(v) for v in value]
    return value


def _vocabulary_part(fingerprint: str | None) -> str:
    """``sha256=<hex> vocab=<n>`` of a tokenizer fingerprint (the ``name=`` part is a path), or ``unknown``."""
    if not fingerprint:
        return "unknown"
    return " ".join(w for w in fingerprint.split() if w.startswith(("sha256=", "vocab=")))


def _code_spec(spec: str | None, *, default_name: str | None) -> str:
    """``spec`` with its file or module replaced by what identifies the code: a file's name, function
    or class and content digest (``reward.py:score@sha256=<hex>``); a module's spec and source digest."""
    if not spec:
        return ""
    if default_name is None and ":" not in spec:
        return spec  # a registered manager name or entry point: rewardq's version covers the built-ins
    target, name = split_spec(spec) if default_name else spec.rsplit(":", 1)
    path = os.path.expanduser(target)
    if target.endswith(".py") or os.sep in target or os.path.isfile(path):
        digest = file_digest(path)
        return f"{os.path.basename(target)}:{name}@sha256={digest}" if digest else f"{spec}@unreadable"
    digest = file_digest(_module_file(target))
    return f"{target}:{name}@sha256={digest}" if digest else f"{target}:{name}"


def file_digest(path: str | None) -> str | None:
    """16 hex characters of the SHA-256 of a file's content, or None when it cannot be read."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except OSError:
        return None


def _module_file(name: str) -> str | None:
    """The source file of module ``name`` (its package is imported to find it), or None."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None) if spec is not None else None
    return origin if origin and origin.endswith(".py") else None


def code_identity(spec: str, *, default_name: str | None) -> str:
    """What identifies the code ``spec`` names (a file's name, function and content digest; a module's
    spec and source digest): the scoring fingerprint's part for it, and a result's ``scorer``."""
    return _code_spec(spec, default_name=default_name)
