"""Values that look like credentials: masked wherever a value is shown, never where it counts.

A worker shows its options and reward-function keyword arguments in several places: the start-up
log, ``rewardq config``, the scoring configuration it records in ``<ns>:meta`` (``rewardq status``,
``rewardq inspect``) and the exit-2 message of a worker whose configuration differs. A value there
may be a credential (an API key in ``extra_body``, a password in a URL). :func:`shown_value` is
what every one of those places shows:

* a string holding a credential of a known form (:data:`CREDENTIAL_VALUES`: ``sk-...``, ``hf_...``,
  ``ghp_...``, AWS ``AKIA...``, Google ``AIza...``, a JWT, a ``Bearer`` or ``Basic`` token) or a URL
  with a password (or a token as its user name) is shown with each credential replaced by ``***``,
  followed by ``<masked sha256:XXXXXXXX>``: a keyed digest of the whole real value, so two
  different values show differently without either being shown;
* where space is short (the scoring configuration), a string longer than :data:`MAX_SHOWN_CHARS`
  is shown as its length and the same digest.

Recognising a credential by its form catches ordinary text too (``"sk-strict-grading-mode-v2"``,
``"bearer instructions-strict"``). That is harmless here because masking is display only: the
scoring fingerprint counts the real value of every option and keyword argument
(:mod:`rewardq.reward.scoring_fingerprint`), so two such values never share a namespace silently.
What is masked is said (:data:`MASKED_NOTE`).

The digest is an HMAC-SHA-256 under a fixed key, cut to 8 hex characters: enough to tell two
values apart in a message, too short to confirm a guessed key, and not a plain SHA-256 that a
table of common strings would reverse.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any

from rewardq.queue.connection import redact_url

__all__ = ["CREDENTIAL", "CREDENTIAL_VALUES", "MASKED_NOTE", "mask_credentials", "shown_value", "value_tag"]

#: What a masked credential becomes where it is shown.
CREDENTIAL = "***"
#: What a display says of masked values.
MASKED_NOTE = "masked: looks like a credential; its digest still counts"
#: Longest value shown whole; a longer one is shown as its length and digest.
MAX_SHOWN_CHARS = 80
#: Credentials recognised by their value (not by the option's name). Each alternative is a form
#: that rarely occurs in ordinary text: a provider's key prefix followed by a long random part.
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
#: The key of :func:`value_tag`'s HMAC: fixed, so every worker of a fleet shows one value alike.
_TAG_KEY = b"rewardq: a shown value's digest"


def mask_credentials(text: str) -> str:
    """``text`` with every credential recognised by its value replaced by :data:`CREDENTIAL`; the rest
    of it unchanged."""
    if _URL.fullmatch(text):
        text = redact_url(text)
    return CREDENTIAL_VALUES.sub(CREDENTIAL, text)


def value_tag(text: str) -> str:
    """8 hex characters of a keyed digest of ``text`` (see the module doc)."""
    return hmac.new(_TAG_KEY, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:8]


def shown_value(value: Any, path: str = "", masked: list[str] | None = None, *, abridge: bool = False) -> Any:
    """``value`` (nested mappings and lists too) as it is shown: credentials masked, with a digest of
    the real value (see the module doc); with ``abridge``, strings longer than :data:`MAX_SHOWN_CHARS`
    as their length and digest. The path of each masked string (``path.key[0]``) is appended to
    ``masked``."""
    if isinstance(value, dict):
        return {
            str(k): shown_value(v, f"{path}.{k}" if path else str(k), masked, abridge=abridge) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [shown_value(v, f"{path}[{i}]", masked, abridge=abridge) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    hidden = mask_credentials(value)
    if hidden != value and masked is not None:
        masked.append(path)
    if abridge and len(value) > MAX_SHOWN_CHARS:
        return f"<{len(value)} chars sha256={value_tag(value)}>"
    return value if hidden == value else f"{hidden} <masked sha256:{value_tag(value)}>"
