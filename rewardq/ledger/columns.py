"""Binary columns of ledger rows, their values copied into byte buffers as they come.

The ids of a partition's outputs (prompt, response, mask) are the bulk of a ledger's bytes. A
:class:`BinaryColumn` copies each value into one buffer as it comes (the frame that held it can
be dropped at once) and makes the buffer an Arrow array without another copy. With
:class:`Buffers` the buffers are kept from table to table and segment to segment, so a flusher
process copies each row group's ids into memory it mapped already (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

#: Bytes of ids one Arrow chunk holds at most (a ``binary`` array's offsets are 32-bit).
_CHUNK_BYTES = 1 << 30
#: A binary column's first buffer (it doubles as needed).
_FIRST_BYTES = 1 << 20
_NO_BYTES = np.empty(0, dtype=np.uint8)  # a column's buffer before its first value


class Buffers:
    """Byte buffers kept from table to table and segment to segment, so the next row group's ids
    are copied into memory already mapped (see :class:`BinaryColumn`).

    Args:
        size: bytes of a new buffer: room for a row group's ids of one column, taken at once
            rather than by doubling (whose smaller buffers the allocator may keep as garbage);
            its pages take memory only once written.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._spare: dict[int, list[np.ndarray]] = {}  # by column: each keeps the pages it wrote

    def take(self, column: int, n: int) -> np.ndarray:
        """A buffer of at least ``n`` bytes for ``column``: one it gave back if it has room."""
        spare = self._spare.get(column)
        while spare:
            buf = spare.pop()
            if len(buf) >= n:
                return buf
        return np.empty(max(n, self.size), dtype=np.uint8)

    def give(self, column: int, bufs: Iterable[np.ndarray]) -> None:
        """Buffers of ``column`` no Arrow array uses any more."""
        self._spare.setdefault(column, []).extend(b for b in bufs if len(b))


class BinaryColumn:
    """One binary column of a partition, its values copied into one buffer as they come (the frame
    that held them is dropped at once), then made an Arrow array without another copy.

    ``buffers``: where the buffers of ``column`` come from and, at :meth:`reset`, go back to;
    None: fresh buffers (doubling from 1 MB), which the arrays keep."""

    def __init__(self, column: int, buffers: Buffers | None = None) -> None:
        self.column, self.buffers = column, buffers
        self.chunks: list[pa.Array] = []
        self.used: list[np.ndarray] = []  # buffers the chunks are made of
        self.buf = _NO_BYTES  # taken at the first value
        self.pos = 0
        self.lengths: list[int] = []
        self.valid: list[bool] = []

    def _take(self, n: int) -> np.ndarray:
        if self.buffers is not None:
            return self.buffers.take(self.column, n)
        return np.empty(max(n, _FIRST_BYTES), dtype=np.uint8)

    def extend(self, values: Iterable[Any]) -> None:
        buf, pos, lengths, valid = self.buf.data, self.pos, self.lengths, self.valid
        for v in values:
            if v is None:
                lengths.append(0)
                valid.append(False)
                continue
            n = len(v)
            if pos + n > len(buf):
                self.pos = pos
                self._grow(n)
                buf, pos = self.buf.data, self.pos
            buf[pos : pos + n] = v
            pos += n
            lengths.append(n)
            valid.append(True)
        self.pos = pos

    def extend_run(self, data: memoryview, lengths: list[int | None], *, none_is_empty: bool) -> None:
        """Values given as one run of bytes (``data``) and each one's length (None: a null value,
        or an empty one when ``none_is_empty``): one copy for all of them."""
        n = len(data)
        if self.pos + n > len(self.buf):
            self._grow(n)
        self.buf.data[self.pos : self.pos + n] = data
        self.pos += n
        if None not in lengths:
            self.lengths.extend(cast("list[int]", lengths))
            self.valid.extend([True] * len(lengths))
            return
        self.lengths.extend(0 if k is None else k for k in lengths)
        self.valid.extend([none_is_empty or k is not None for k in lengths])

    def _grow(self, n: int) -> None:
        """Room for ``n`` more bytes: a chunk cut at :data:`_CHUNK_BYTES`, else a buffer twice as large."""
        if self.pos + n > _CHUNK_BYTES and self.lengths:
            self._cut()
            if n <= len(self.buf):
                return
        bigger = self._take(max(2 * len(self.buf), self.pos + n))
        bigger[: self.pos] = self.buf[: self.pos]
        self.buf = bigger  # the smaller one is let go: the next row group needs the larger

    def _cut(self) -> None:
        import pyarrow as pa

        n = len(self.lengths)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(self.lengths, out=offsets[1:])
        validity = None
        if not all(self.valid):
            validity = pa.py_buffer(np.packbits(np.array(self.valid, dtype=bool), bitorder="little"))
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(self.buf[: self.pos])]
        self.chunks.append(pa.Array.from_buffers(pa.binary(), n, buffers))
        self.used.append(self.buf)
        self.buf = _NO_BYTES
        self.pos, self.lengths, self.valid = 0, [], []

    def array(self) -> pa.ChunkedArray:
        import pyarrow as pa

        if self.lengths or not self.chunks:
            self._cut()
        return pa.chunked_array(self.chunks, type=pa.binary())

    def counts(self) -> pa.ChunkedArray:
        """Each value's length."""
        import pyarrow as pa
        import pyarrow.compute as pc

        return pc.binary_length(self.array()).cast(pa.int32())

    def reset(self) -> None:
        """Start again, the arrays made so far no longer used: their buffers go back to ``buffers``."""
        if self.buffers is not None:
            self.buffers.give(self.column, self.used)
        self.chunks, self.used = [], []
        self.pos, self.lengths, self.valid = 0, [], []
