"""Decoding a byte-level BPE tokenizer's ids through a table of each id's bytes.

The ``tokenizers`` library decodes ids of a tokenizer whose decoder is ``ByteLevel`` (GPT-2's
scheme: DeepSeek, Qwen, Llama 3 and most current models) like this
(``TokenizerImpl::decode`` and ``ByteLevel::decode_chain``):

1. each id becomes its token string (the added vocabulary first, then the model's); an id with
   no token is dropped; with ``skip_special_tokens``, a token whose string is in the library's set
   of special contents is dropped too;
2. each token's characters are mapped back to bytes through the byte-to-unicode table, or, when
   one of its characters is not in that table (an added token such as ``<｜end▁of▁sentence｜>``),
   the token's own UTF-8 bytes are taken;
3. all these bytes are joined and read as UTF-8, each invalid sequence replaced by U+FFFD
   (``String::from_utf8_lossy``, which replaces maximal subparts, as Python's ``"replace"`` does).

Steps 1 and 2 depend on the id alone, so :class:`ByteLevelTable` computes each id's bytes once,
when the worker loads the tokenizer, and a decode is one gather and one ``bytes.decode``: 0.15
against 1.04–1.13 ms of CPU for a 2,484-id response of a 128k vocabulary (the library walks a hash
map per character). The result is the library's own, character for character; a tokenizer with
any other decoder (or a ``ByteLevel`` inside a sequence of decoders) is not given a table, and a
sequence with an id outside the table falls back to the library's decode.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def byte_to_unicode() -> dict[str, int]:
    """GPT-2's map from the characters a byte-level token is written with to the bytes they stand
    for (the ``tokenizers`` ``ByteLevel`` table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = dict(zip(printable, printable))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


class ByteLevelTable:
    """Each id's bytes, for decoding without the library (see the module docstring).

    Args:
        keep: the bytes of every id (``b""`` for an id with no token), an object array.
        skip: the same with the special tokens' bytes ``b""`` (``skip_special_tokens=True``).
    """

    def __init__(self, keep: np.ndarray, skip: np.ndarray) -> None:
        self.keep = keep
        self.skip = skip
        self.size = len(keep)

    @classmethod
    def of(cls, rust: object) -> ByteLevelTable | None:
        """The table of a ``tokenizers.Tokenizer`` whose decoder is ``ByteLevel``, else None."""
        try:
            from tokenizers import decoders
        except ImportError:
            return None
        if type(getattr(rust, "decoder", None)) is not decoders.ByteLevel:
            return None
        tok: Any = rust
        chars = byte_to_unicode()
        added = tok.get_added_tokens_decoder()
        contents = {t.content for t in added.values()}
        size = max(tok.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
        keep = np.empty(size, dtype=object)
        skip = np.empty(size, dtype=object)
        for i in range(size):
            token = tok.id_to_token(i)
            if token is None:
                keep[i] = skip[i] = b""
                continue
            try:
                raw = bytes([chars[c] for c in token])
            except KeyError:
                raw = token.encode("utf-8")
            keep[i] = raw
            # Whether the library drops it with skip_special_tokens is asked of the library: it keeps
            # its own set of special contents, which an added token's ``special`` flag can contradict
            # (a content added as special and again as not special keeps being skipped).
            skip[i] = b"" if token in contents and tok.decode([i], skip_special_tokens=True) == "" else raw
        return cls(keep, skip)

    def decode(self, ids: object, skip_special_tokens: bool) -> str | None:
        """The text of ``ids`` (a 1-D integer tensor, array or list); None when they are not that
        or an id is outside the table (the caller then asks the library)."""
        if hasattr(ids, "detach"):  # torch.Tensor: its array, no copy
            ids = ids.detach().cpu().numpy()
        arr = np.asarray(ids)
        if arr.ndim != 1:
            return None
        if not arr.size:
            return ""
        if arr.dtype.kind not in "iu" or int(arr.min()) < 0 or int(arr.max()) >= self.size:
            return None
        table = self.skip if skip_special_tokens else self.keep
        return b"".join(table[arr].tolist()).decode("utf-8", "replace")
