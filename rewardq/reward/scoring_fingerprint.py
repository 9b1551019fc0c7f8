"""A fingerprint of what decides a reward, so one namespace is served by one scoring configuration.

:func:`scoring_fingerprint` reads a worker's configuration and returns a :class:`ScoringFingerprint`:
``digest``, 16 hex characters of SHA-256 over the parts below, ``text``, the same parts as one
readable line (``manager=naive options={} reward_fn=... tokenizer=... rewardq=0.2.0``), and
``shown``, each option and keyword argument on its own (what a conflict message compares).

The parts are what changes a reward and nothing else:

* ``manager``: the ``--manager`` spec; for ``FILE.py:Class`` the file's name, the class and the
  SHA-256 of the file's content (not its path: the same file in another folder is the same
  manager); for ``package.module:Class`` the spec and the digest of the module's source file;
* ``options``: every ``--manager-option`` value, as canonical JSON;
* ``reward_fn``: the file's content digest and the function name (or the module, its source
  digest and the function), and every one of its keyword arguments;
* ``tokenizer``: the vocabulary hash and size of :func:`~rewardq.reward.tokenizer_fingerprint.tokenizer_fingerprint`
  (its ``name=`` part is a path, left out);
* ``rewardq``: the installed version, which decides the built-in managers and scorers.

Every option and keyword argument counts with its **real value**, whatever its name or its look
(``max_tokens``, ``tokenizer`` and ``keyword_bonus`` all change rewards, and so does a mode
``"sk-strict-grading-mode-v2"``). Two kinds of value are rewritten:

* **Options their manager declares a credential** (``secret=True``, :mod:`rewardq.reward.options`)
  count as ``***`` whatever their value: they authenticate, they do not score, and a fleet must be
  able to rotate them one worker at a time. ``text`` ends with ``secret=<where>``.
* **Files, by their content**: a string that names an existing file (it holds a path separator)
  counts as the file's name and content digest, as the reward function's file does: a prompt
  template edited in place is another configuration, the same file in another folder is not.

Nothing else is left out. A value that merely *looks* like a credential (an API key of a known
form, a password in a URL, a bearer token: :mod:`rewardq.reward.credentials`) counts with its real
value and is masked only where it is shown: ``text`` and ``shown`` (and so ``<ns>:meta``, the logs
and the exit-2 message) hold it as ``*** <masked sha256:XXXXXXXX>``, a keyed digest that tells two
values apart without showing either, and ``text`` ends with ``masked=<where> (masked: looks like a
credential; its digest still counts)``. Rotating such a value (a key inside ``extra_body`` or a URL)
is a new configuration: put keys in the environment (genrm's ``api_key_env``) or in an option
declared secret, or roll it with ``--takeover``.

Nothing that differs between two processes of one fleet goes in: no worker name, port, config-file
path or folder. Integral floats count as integers (``1.0`` and ``1`` are the same bonus).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from rewardq.errors import ConfigError
from rewardq.queue.connection import redact_url
from rewardq.reward.credentials import CREDENTIAL, MASKED_NOTE, shown_value
from rewardq.reward.execution.loader import split_spec
from rewardq.reward.options import secret_option_names
from rewardq.reward.registry import options_of

#: Longest ``text`` of a fingerprint, in characters (it is shown in errors and ``rewardq status``).
FINGERPRINT_LINE_CHARS = 600
#: Differences a conflict message names (the rest are counted).
MAX_DIFFERENCES_SHOWN = 6
#: What ``text`` says of options left out as declared credentials.
SECRET_NOTE = "declared credentials: not counted"


@dataclass(frozen=True)
class ScoringFingerprint:
    """``digest`` (16 hex characters) identifies the configuration; ``text`` describes it; ``shown``
    holds each option and keyword argument as displayed (``{"reward_kwargs.keyword_bonus": "1.0"}``).
    Neither ``text`` nor ``shown`` holds a value that looks like a credential (module doc)."""

    digest: str
    text: str
    shown: dict[str, str] = field(default_factory=dict, compare=False)


def scoring_fingerprint(cfg: Any, tokenizer_fingerprint: str | None) -> ScoringFingerprint:
    """The fingerprint of the scoring configuration of ``cfg`` (a :class:`~rewardq.config.WorkerConfig`)
    with the tokenizer whose :func:`~rewardq.reward.tokenizer_fingerprint.tokenizer_fingerprint` is given."""
    from rewardq import __version__

    secret: list[str] = []
    parts: dict[str, Any] = {
        "manager": _code_spec(cfg.manager, default_name=None),
        "options": canonical(_without_declared_secrets(cfg, secret)),
        "reward_fn": _code_spec(cfg.reward_fn, default_name="compute_score") if cfg.reward_fn else None,
        "reward_kwargs": canonical(cfg.reward_fn_kwargs or {}),
        "tokenizer": _vocabulary_part(tokenizer_fingerprint),
        "rewardq": __version__,
    }
    digest = hashlib.sha256(_json(parts).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    masked: list[str] = []
    shown = {
        **parts,
        "options": shown_value(parts["options"], "options", masked, abridge=True),
        "reward_kwargs": shown_value(parts["reward_kwargs"], "reward_kwargs", masked, abridge=True),
    }
    return ScoringFingerprint(digest, describe(shown, masked, secret), shown_parts(shown))


def declared_secrets(manager: str) -> frozenset[str]:
    """The options manager ``manager`` declares credentials (:mod:`rewardq.reward.options`); none for an
    unknown manager (it never starts)."""
    try:
        return secret_option_names(options_of(manager))
    except ConfigError:
        return frozenset()


def _without_declared_secrets(cfg: Any, secret: list[str]) -> dict[str, Any]:
    """``cfg``'s manager options with each one its manager declares a credential as :data:`CREDENTIAL`
    (its path appended to ``secret``)."""
    options = dict(cfg.manager_options or {})
    for name in sorted(declared_secrets(cfg.manager) & set(options)):
        if options[name] is not None:
            options[name] = CREDENTIAL
            secret.append(f"options.{name}")
    return options


def shown_settings(cfg: Any) -> dict[str, object]:
    """Every setting of the worker settings ``cfg`` as the start-up log and ``rewardq config`` show
    it: the Redis URL's password redacted, declared credential options as ``***``, and option or
    keyword-argument values that look like credentials masked."""
    shown: dict[str, object] = {name: getattr(cfg, name) for name in cfg.settings()}
    options = _without_declared_secrets(cfg, [])
    shown.update(shown_value({"manager_options": options, "reward_fn_kwargs": dict(cfg.reward_fn_kwargs or {})}))
    shown["redis_url"] = redact_url(cfg.redis_url)
    return shown


def describe(parts: dict[str, Any], masked: list[str] | None = None, secret: list[str] | None = None) -> str:
    """One readable line of the parts as shown, cut to :data:`FINGERPRINT_LINE_CHARS`."""
    words = [f"manager={parts['manager']}"]
    if parts["options"]:
        words.append(f"options={_json(parts['options'])}")
    words.append(f"reward_fn={parts['reward_fn'] or 'default'}")
    if parts["reward_kwargs"]:
        words.append(f"reward_kwargs={_json(parts['reward_kwargs'])}")
    words += [f"tokenizer={parts['tokenizer']}", f"rewardq={parts['rewardq']}"]
    if secret:
        words.append(f"secret={','.join(secret)} ({SECRET_NOTE})")
    if masked:
        words.append(f"masked={','.join(masked)} ({MASKED_NOTE})")
    text = " ".join(words)
    return text if len(text) <= FINGERPRINT_LINE_CHARS else text[: FINGERPRINT_LINE_CHARS - 3] + "..."


def shown_parts(parts: dict[str, Any]) -> dict[str, str]:
    """Every leaf of the parts as shown under its dotted path (``options.max_tokens``)."""
    out: dict[str, str] = {}

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{path}.{k}", v)
        else:
            out[path] = value if isinstance(value, str) else _json(value)

    for name, value in parts.items():
        walk(name, value if value is not None else "")
    return out


def differences(recorded: dict[str, str], mine: dict[str, str]) -> str:
    """What differs between two :attr:`ScoringFingerprint.shown` (``options.x: 1 here, 2 recorded``; the
    first :data:`MAX_DIFFERENCES_SHOWN`), or ``""``. A masked value is named, never shown."""
    changed = [k for k in sorted(set(recorded) | set(mine)) if recorded.get(k) != mine.get(k)]
    shown = changed[:MAX_DIFFERENCES_SHOWN]
    words = [f"{k}: {mine.get(k, '(unset)')} here, {recorded.get(k, '(unset)')} recorded" for k in shown]
    if len(changed) > len(shown):
        words.append(f"and {len(changed) - len(shown)} more")
    said = "; ".join(words)
    return f"{said} ({MASKED_NOTE})" if "<masked sha256:" in said else said


def canonical(value: Any) -> Any:
    """``value`` as it counts in the digest: its real value, with files as their content digest,
    integral floats as integers, mapping keys as text."""
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        return value
    return _file_part(value) or value


def without_credentials(value: Any) -> Any:
    """``value`` (nested mappings and lists too) as the fingerprint shows it: for records kept beside
    the fingerprint (a result's provenance)."""
    return shown_value(canonical(value))


def _file_part(value: str) -> str | None:
    """``<name>@sha256=<hex>`` when ``value`` names an existing file (it holds a path separator or
    starts with ``~``), else None."""
    if len(value) > 4096 or "\n" in value or not (os.sep in value or value.startswith("~")):
        return None
    path = os.path.expanduser(value)
    if not os.path.isfile(path):
        return None
    digest = file_digest(path)
    return f"{os.path.basename(path)}@sha256={digest}" if digest else None


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


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
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()[:16]


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
