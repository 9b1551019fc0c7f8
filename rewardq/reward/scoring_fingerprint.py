"""A fingerprint of what decides a reward, so one namespace is served by one scoring configuration.

:func:`scoring_fingerprint` reads a worker's configuration and returns a :class:`ScoringFingerprint`:
``digest``, 16 hex characters of SHA-256 over the parts below, ``text``, the same parts as one
readable line (``manager=naive options={} reward_fn=... tokenizer=... rewardq=0.1.0``), and
``shown``, each option and keyword argument on its own (what a conflict message compares).

The parts are what changes a reward and nothing else:

* ``manager``: the ``--manager`` spec; for ``FILE.py:Class`` the file's name, the class and the
  SHA-256 of the file's content (not its path: the same file in another folder is the same
  manager); for ``package.module:Class`` the spec and the digest of the module's source file;
* ``options``: every ``--manager-option`` value, as canonical JSON;
* ``reward_fn``: the file's content digest and the function name (or the module, its source
  digest and the function), and every one of its keyword arguments;
* ``tokenizer``: the vocabulary hash and size of :func:`~rewardq.reward.fingerprint.tokenizer_fingerprint`
  (its ``name=`` part is a path, left out);
* ``rewardq``: the installed version, which decides the built-in managers and scorers.

Every option and keyword argument counts with its real value, whatever its name (``max_tokens``,
``tokenizer`` and ``keyword_bonus`` all change rewards). Two kinds of value are rewritten:

* **Credentials, recognised by their value** (:func:`mask_credentials`): an API key of a known
  form (``sk-...``, ``hf_...``, ``ghp_...``, AWS ``AKIA...``, Google ``AIza...``, a JWT), a
  ``Bearer`` or ``Basic`` token, the password of a URL (``redis://user:PASSWORD@host``, or a
  token as its user name, ``https://TOKEN@host``). Each is replaced by ``***`` in the digest and
  the text, so a rotated key is the same configuration and no secret reaches ``<ns>:meta`` or a
  log; ``text`` ends with ``masked=<where>`` saying which values were masked. The rest of the
  value still counts (a URL with another host is another configuration).
* **Files, by their content**: a string that names an existing file (it holds a path separator)
  counts as the file's name and content digest, as the reward function's file does: a prompt
  template edited in place is another configuration, the same file in another folder is not.

Nothing that differs between two processes of one fleet goes in: no worker name, port, config-file
path or folder. Integral floats count as integers (``1.0`` and ``1`` are the same bonus).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from rewardq.queue.connection import redact_url
from rewardq.reward.execution.loader import split_spec

#: Longest ``text`` of a fingerprint, in characters (it is shown in errors and ``rewardq status``).
MAX_TEXT_CHARS = 600
#: Longest value shown whole in ``text`` and ``shown``; a longer one is shown as its length and digest.
MAX_SHOWN_CHARS = 80
#: Differences a conflict message names (the rest are counted).
MAX_DIFFERENCES_SHOWN = 6
#: What a masked credential becomes, in the digest and the text.
CREDENTIAL = "***"
#: Credentials recognised by their value (not by the option's name). Each alternative is a form
#: that does not occur in ordinary text: a provider's key prefix followed by a long random part.
CREDENTIAL_VALUES = re.compile(
    r"""(?<![\w-])(?:sk|rk|pk)-(?:ant-|proj-|live-|test-|or-v1-)?[A-Za-z0-9_-]{16,}   # OpenAI, Anthropic, OpenRouter
    | (?<![\w-])(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}                          # Stripe-style
    | (?<![\w-])(?:hf|gsk|pplx|r8|xai)[_-][A-Za-z0-9]{20,}                           # Hugging Face, Groq, ...
    | (?<![\w-])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})          # GitHub
    | (?<![\w-])glpat-[A-Za-z0-9_-]{20,}                                             # GitLab
    | (?<![\w-])xox[abposr]-[A-Za-z0-9-]{10,}                                        # Slack
    | (?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])                       # AWS access key id
    | (?<![\w-])AIza[A-Za-z0-9_-]{35}                                                # Google
    | (?<![\w-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+           # a JWT
    | (?i:\bbearer)\s+[A-Za-z0-9._~+/-]{12,}=*                                        # Authorization: Bearer
    | \bBasic\s+(?=[A-Za-z0-9+/]*\d)[A-Za-z0-9+/]{12,}=*                              # Authorization: Basic
    """,
    re.VERBOSE,
)
#: A value that is one URL (its password, or a user name alone, is masked as ``rewardq status`` masks one).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


@dataclass(frozen=True)
class ScoringFingerprint:
    """``digest`` (16 hex characters) identifies the configuration; ``text`` describes it; ``shown``
    holds each option and keyword argument as displayed (``{"reward_kwargs.keyword_bonus": "1.0"}``)."""

    digest: str
    text: str
    shown: dict[str, str] = field(default_factory=dict, compare=False)


def scoring_fingerprint(cfg: Any, tokenizer_fingerprint: str | None) -> ScoringFingerprint:
    """The fingerprint of the scoring configuration of ``cfg`` (a :class:`~rewardq.config.WorkerConfig`)
    with the tokenizer whose :func:`~rewardq.reward.fingerprint.tokenizer_fingerprint` is given."""
    from rewardq import __version__

    masked: list[str] = []
    parts: dict[str, Any] = {
        "manager": _code_spec(cfg.manager, default_name=None),
        "options": canonical(cfg.manager_options or {}, "options", masked),
        "reward_fn": _code_spec(cfg.reward_fn, default_name="compute_score") if cfg.reward_fn else None,
        "reward_kwargs": canonical(cfg.reward_fn_kwargs or {}, "reward_kwargs", masked),
        "tokenizer": _vocabulary_part(tokenizer_fingerprint),
        "rewardq": __version__,
    }
    digest = hashlib.sha256(_json(parts).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return ScoringFingerprint(digest, describe(parts, masked), shown_parts(parts))


def describe(parts: dict[str, Any], masked: list[str] | None = None) -> str:
    """One readable line of the parts (long values as their length and digest), cut to :data:`MAX_TEXT_CHARS`."""
    words = [f"manager={parts['manager']}"]
    if parts["options"]:
        words.append(f"options={_json(_abridged(parts['options']))}")
    words.append(f"reward_fn={parts['reward_fn'] or 'default'}")
    if parts["reward_kwargs"]:
        words.append(f"reward_kwargs={_json(_abridged(parts['reward_kwargs']))}")
    words += [f"tokenizer={parts['tokenizer']}", f"rewardq={parts['rewardq']}"]
    if masked:
        words.append(f"masked={','.join(masked)}")
    text = " ".join(words)
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 3] + "..."


def shown_parts(parts: dict[str, Any]) -> dict[str, str]:
    """Every leaf of the parts under its dotted path (``options.max_tokens``), as displayed."""
    out: dict[str, str] = {}

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{path}.{k}", v)
        else:
            out[path] = _json(_abridged(value)) if not isinstance(value, str) else _abridged(value)

    for name, value in parts.items():
        walk(name, value if value is not None else "")
    return out


def differences(recorded: dict[str, str], mine: dict[str, str]) -> str:
    """What differs between two :attr:`ScoringFingerprint.shown` (``options.x: 1 here, 2 recorded``; the
    first :data:`MAX_DIFFERENCES_SHOWN`), or ``""``."""
    changed = [k for k in sorted(set(recorded) | set(mine)) if recorded.get(k) != mine.get(k)]
    shown = changed[:MAX_DIFFERENCES_SHOWN]
    words = [f"{k}: {mine.get(k, '(unset)')} here, {recorded.get(k, '(unset)')} recorded" for k in shown]
    if len(changed) > len(shown):
        words.append(f"and {len(changed) - len(shown)} more")
    return "; ".join(words)


def canonical(value: Any, path: str, masked: list[str]) -> Any:
    """``value`` as it counts in the digest: credentials masked (their paths appended to ``masked``),
    files as their content digest, integral floats as integers, mapping keys as text."""
    if isinstance(value, dict):
        return {str(k): canonical(v, f"{path}.{k}", masked) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v, f"{path}[{i}]", masked) for i, v in enumerate(value)]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        return value
    text = mask_credentials(value)
    if text != value:
        masked.append(path)
        return text
    return _file_part(value) or value


def without_credentials(value: Any) -> Any:
    """``value`` (nested mappings and lists too) with every credential masked, as it counts in the
    digest: for records kept beside the fingerprint (a result's provenance)."""
    return canonical(value, "", [])


def mask_credentials(text: str) -> str:
    """``text`` with every credential recognised by its value replaced by :data:`CREDENTIAL`
    (see the module doc); the rest of it unchanged."""
    if _URL.fullmatch(text):
        text = redact_url(text)
    return CREDENTIAL_VALUES.sub(CREDENTIAL, text)


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


def _abridged(value: Any) -> Any:
    """``value`` for display: strings longer than :data:`MAX_SHOWN_CHARS` as ``<N chars sha256=...>``."""
    if isinstance(value, dict):
        return {k: _abridged(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_abridged(v) for v in value]
    if isinstance(value, str) and len(value) > MAX_SHOWN_CHARS:
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        return f"<{len(value)} chars sha256={digest}>"
    return value


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
