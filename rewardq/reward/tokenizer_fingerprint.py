"""A short name for a tokenizer's vocabulary, so a worker can tell it decodes with the trainer's tokenizer.

:func:`tokenizer_fingerprint` gives ``"sha256=<16 hex> vocab=<ids> name=<where it came from>"``:

* ``sha256`` hashes the tokenizer's base vocabulary, every ``id<TAB>token`` line in id order (added
  and special tokens left out: transformers may add a pad token the plain ``tokenizers`` library
  does not, and the ids both sides share still decode alike). Two tokenizers with the same hash
  decode every id they share to the same text;
* ``vocab`` is the number of ids, added tokens included (what the worker bounds ids by);
* ``name`` is informative only (a path on the trainer is another path on a worker).

Producers (the verl adapter and hook) send it with every record; a worker whose fingerprint has
another ``sha256`` gives every key of the trajectory an error result naming both tokenizers
(:func:`rewardq.queue.checks.tokenizer_mismatch`) instead of a reward from the wrong text.

It works on rewardq's tokenizers (:mod:`rewardq.reward.tokenizer`), transformers tokenizers (fast
and slow) and ``tokenizers.Tokenizer``; for anything else it returns None (nothing is checked).
Hashing DeepSeek's 129k-token vocabulary took 1.3 s on a busy 2-core machine, so each tokenizer
object is fingerprinted once per process.
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rewardq.reward.tokenizer import Tokenizer

#: Longest ``name=`` part of a fingerprint (the whole string stays far below the wire limit).
MAX_NAME_CHARS = 200

_lock = threading.Lock()
#: id(tokenizer) -> (tokenizer, fingerprint); the tokenizer is kept so its id is never reused.
_cache: dict[int, tuple[Any, str | None]] = {}


def tokenizer_fingerprint(tokenizer: Tokenizer | None) -> str | None:
    """The fingerprint of ``tokenizer`` (see the module docstring), computed once per object."""
    if tokenizer is None:
        return None
    with _lock:
        hit = _cache.get(id(tokenizer))
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    parts = _vocabulary(tokenizer)
    fingerprint = None
    if parts is not None:
        base, total, name = parts
        lines = "\n".join(f"{i}\t{t}" for t, i in sorted(base.items(), key=lambda kv: (kv[1], kv[0])))
        digest = hashlib.sha256(lines.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        clean = " ".join(str(name).split())[:MAX_NAME_CHARS] or "?"
        fingerprint = f"sha256={digest} vocab={total} name={clean}"
    with _lock:
        if len(_cache) > 64:  # a process holds a handful of tokenizers; never grow without bound
            _cache.clear()
        _cache[id(tokenizer)] = (tokenizer, fingerprint)
    return fingerprint


def _vocabulary(tok: Any) -> tuple[dict[str, int], int, str] | None:
    """(base vocabulary, number of ids incl. added tokens, name) of any supported tokenizer."""
    name = getattr(tok, "name", None) or getattr(tok, "name_or_path", None) or type(tok).__name__
    inner = getattr(tok, "backend", None)  # rewardq's FastTokenizer / TransformersTokenizer
    if inner is not None and not isinstance(inner, str):
        tok = inner
    raw = getattr(tok, "backend_tokenizer", None)  # a transformers fast tokenizer's tokenizers.Tokenizer
    if raw is not None:
        tok = raw
    try:
        if hasattr(tok, "get_vocab_size"):  # tokenizers.Tokenizer
            return dict(tok.get_vocab(with_added_tokens=False)), int(tok.get_vocab_size(with_added_tokens=True)), name
        if hasattr(tok, "get_vocab"):  # a slow transformers tokenizer
            full = dict(tok.get_vocab())
            added = tok.get_added_vocab() if hasattr(tok, "get_added_vocab") else {}
            return {t: i for t, i in full.items() if t not in added}, len(full), name
    except Exception:  # noqa: BLE001 - a tokenizer that cannot list its vocabulary is not checked
        return None
    return None
