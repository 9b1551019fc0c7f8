"""Trajectory assembly: from the stored payloads of a complete trajectory to records.

Pure functions, no Redis: the store script has already checked that outputs ``0..final``
are all present and that exactly one is final; here every payload is decoded and checked
again against the trajectory it claims to belong to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rewardq.errors import RecordError
from rewardq.queue.codec import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_OUTPUTS,
    DEFAULT_MAX_RECORD_BYTES,
    OutputRecord,
    decode_output,
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
    records = []
    n = len(payloads)
    for i, payload in enumerate(payloads):
        if payload is None:
            raise RecordError("index", f"output {i} of {tid} vanished before scoring")
        if known is not None and known.index == i and known.tid == tid:
            rec = known
        else:
            rec = decode_output(
                payload,
                max_bytes=max_bytes,
                vocab_size=vocab_size,
                max_outputs=max_outputs,
                max_image_bytes=max_image_bytes,
                tokenizer=tokenizer,
            )
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
