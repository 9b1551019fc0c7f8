"""Text that goes into Redis: always valid UTF-8, and bounded where it is copied into many keys.

redis-py encodes a ``str`` argument as strict UTF-8, so a lone surrogate (``"\\udc80"``, what a
``surrogateescape`` decode or a careless slice of a UTF-16 string leaves) makes the whole command
fail. Every string a worker writes that user code produced (a reward function's extra info, an
exception's message, a traceback) goes through :func:`utf8` or :func:`reason_text` first, so no
string can fail a commit or a dead letter.
"""

from __future__ import annotations

import re

#: Longest reason, in bytes, written into an error result (``error`` and ``reward_extra_info``) of
#: every key of a trajectory. The full reason (up to 4,000 characters) and the traceback are in
#: its dead letter; this bounds what one ``fail`` script writes: at most max_outputs + 1 keys of
#: ~3 KB each.
MAX_REASON_BYTES = 1000

_SURROGATES = re.compile("[\ud800-\udfff]")
#: C0 control characters other than tab and newline, and DEL: JSON escapes each as six bytes.
_CONTROLS = {c: "?" for c in (*range(0, 9), *range(11, 32), 127)}


def utf8(text: str) -> bytes:
    """``text`` as UTF-8; lone surrogates (which UTF-8 cannot hold) become U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text).encode("utf-8")


def cut_utf8(data: bytes, limit: int) -> bytes:
    """``data`` cut to at most ``limit`` bytes at a character boundary, saying how much was cut."""
    if len(data) <= limit:
        return data
    note = f" ... ({len(data) - limit:,}+ more bytes cut)".encode()
    keep = max(0, limit - len(note))
    return data[:keep].decode("utf-8", "ignore").encode("utf-8") + note


def reason_text(text: object, limit: int = MAX_REASON_BYTES) -> str:
    """A reason as an error result stores it: valid UTF-8, control characters (but tab and newline)
    shown as ``?``, at most ``limit`` bytes (a longer one is cut, saying so)."""
    s = text if isinstance(text, str) else str(text)
    if len(s) > 4 * limit:  # cut before translating a huge message
        s = s[: 4 * limit]
    data = utf8(s.translate(_CONTROLS))
    return cut_utf8(data, limit).decode("utf-8")
