"""Trajectory assembly: from the stored payloads of a complete trajectory to records.

Pure functions, no Redis: the store script has already checked that outputs ``0..final``
are all present and that exactly one is final; here every payload is decoded and checked
again against the trajectory it claims to belong to, with the worker's decoder
(:class:`RecordDecoder`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rewardq.errors import RecordError
from rewardq.queue.codec import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_OUTPUTS,
    DEFAULT_MAX_RECORD_BYTES,
    OutputRecord,
    decode_output,
)


@dataclass(frozen=True)
class RecordDecoder:
    """The worker's decoder: :func:`~rewardq.queue.codec.decode_output` within the worker's bounds
    (``max_record_bytes``, the tokenizer's vocabulary, ``max_outputs``, ``max_image_bytes``) and
    tokenizer fingerprint. The intake decodes every entry with it, and a failure the records it
    reads back for its ledger rows (:mod:`rewardq.consumers.failures`). Raises RecordError naming
    the bad field."""

    max_bytes: int = DEFAULT_MAX_RECORD_BYTES
    vocab_size: int | None = None
    max_outputs: int = DEFAULT_MAX_OUTPUTS
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    tokenizer: str | None = None

    def __call__(self, data: object) -> OutputRecord:
        return decode_output(
            data,
            max_bytes=self.max_bytes,
            vocab_size=self.vocab_size,
            max_outputs=self.max_outputs,
            max_image_bytes=self.max_image_bytes,
            tokenizer=self.tokenizer,
        )


def assemble(
    tid: str,
    payloads: Sequence[bytes | None],
    *,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    vocab_size: int | None = None,
    known: OutputRecord | None = None,
    max_outputs: int = DEFAULT_MAX_OUTPUTS,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    tokenizer: str | None = None,
) -> list[OutputRecord]:
    """Decode the outputs of trajectory ``tid`` in index order.

    ``known`` is a record the caller already decoded from the same bytes (the one that
    completed the trajectory); it is used as is. Raises RecordError when a payload is
    missing, undecodable, or out of place (:class:`~rewardq.errors.TokenizerMismatch` when one was
    made with another tokenizer than ``tokenizer``, the worker's fingerprint).
    """
    decode = RecordDecoder(max_bytes, vocab_size, max_outputs, max_image_bytes, tokenizer)
    records = []
    n = len(payloads)
    for i, payload in enumerate(payloads):
        if payload is None:
            raise RecordError("index", f"output {i} of {tid} vanished before scoring")
        if known is not None and known.index == i and known.tid == tid:
            rec = known
        else:
            rec = decode(payload)
        if rec.tid != tid or rec.index != i:
            raise RecordError("index", f"stored output {i} of {tid} is {rec.key}")
        if rec.final != (i == n - 1):
            raise RecordError("final", f"output {rec.key} final={rec.final} in a trajectory of {n} outputs")
        records.append(rec)
    return records


def trajectory_sample(records: Sequence[OutputRecord]) -> dict[str, Any]:
    """The dataset columns of a trajectory: the final output's, else the last non-empty one."""
    for rec in reversed(records):
        if rec.sample:
            return rec.sample
    return {}
