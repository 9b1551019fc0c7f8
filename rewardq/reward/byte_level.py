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
when the worker loads the tokenizer, and lays them out flat: all of them one after another in one
byte array, and per id where its bytes start and how many there are. A decode is then a few numpy
passes over the ids and one ``bytes.decode``, touching no Python object per id: 153 µs of CPU for
a GSM8K response of 2,426 ids of the real 128k vocabulary, where the library took 1,589 µs (it
walks a hash map per character; docs/performance.md, "The byte-level table laid out flat"). The
result is the library's own, character for character; a tokenizer with any other decoder (or a
``ByteLevel`` inside a sequence of decoders) is not given a table, and a sequence with an id
outside the table falls back to the library's decode.
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


#: Bits of an id's entry in :class:`ByteLevelTable` that hold its length; the 31 bits above them
#: hold its start, so a table holds up to 2 GiB of bytes (a 128k vocabulary takes ~1 MiB).
LENGTH_BITS = 32
_LENGTH_MASK = (1 << LENGTH_BITS) - 1


class ByteLevelTable:
    """Each id's bytes, for decoding without the library (see the module docstring).

    Args:
        blob: every id's bytes one after another (uint8).
        keep: per id, ``start << LENGTH_BITS | length`` of its bytes in ``blob`` (int64); an id
            with no token has length 0.
        skip: the same with the special tokens' lengths 0 (``skip_special_tokens=True``).
    """

    def __init__(self, blob: np.ndarray, keep: np.ndarray, skip: np.ndarray) -> None:
        self.blob = blob
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
        pieces: list[bytes] = []
        skipped = np.zeros(size, dtype=bool)
        for i in range(size):
            token = tok.id_to_token(i)
            if token is None:
                pieces.append(b"")
                continue
            try:
                raw = bytes([chars[c] for c in token])
            except KeyError:
                raw = token.encode("utf-8")
            pieces.append(raw)
            # Whether the library drops it with skip_special_tokens is asked of the library: it keeps
            # its own set of special contents, which an added token's ``special`` flag can contradict
            # (a content added as special and again as not special keeps being skipped).
            skipped[i] = token in contents and tok.decode([i], skip_special_tokens=True) == ""
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=size)
        if int(lengths.sum()) >> (63 - LENGTH_BITS):  # 2 GiB of token bytes: left to the library
            return None
        starts = np.cumsum(lengths) - lengths
        keep = starts << LENGTH_BITS | lengths
        skip = np.where(skipped, starts << LENGTH_BITS, keep)
        return cls(np.frombuffer(b"".join(pieces), dtype=np.uint8), keep, skip)

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
        entries = (self.skip if skip_special_tokens else self.keep)[arr]
        lengths = entries & _LENGTH_MASK
        if not lengths.all():  # ids with no bytes (no token, a skipped special) add nothing
            entries = entries[lengths > 0]
            if not entries.size:
                return ""
            lengths = entries & _LENGTH_MASK
        starts = entries >> LENGTH_BITS
        ends = np.cumsum(lengths)
        # the text's byte k is blob[its token's start + k's place in the token]: an index that
        # grows by one inside a token and jumps at each token's first byte, so it is the running
        # sum of steps of one, with each token's jump at its first byte
        steps = np.ones(int(ends[-1]), dtype=np.int64)
        steps[0] = starts[0]
        steps[ends[:-1]] = starts[1:] - starts[:-1] - lengths[:-1] + 1
        return self.blob[np.cumsum(steps)].tobytes().decode("utf-8", "replace")
