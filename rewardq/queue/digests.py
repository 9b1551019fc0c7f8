"""What tells a record delivered twice from a different record for the same key: its digest.

The worker keeps a short fingerprint of every record it files (``h:<i>`` in the trajectory's
hash, :mod:`rewardq.queue.keys`), so that a record that arrives again (a redelivery, a
producer's retried put) is compared with the stored one without reading either: the same
digest is the same record, another digest a conflicting one. The record encoding is
deterministic (:mod:`rewardq.queue.codec`), so equal records have equal bytes.

The digest is XXH3-64 of the record's bytes, tagged ``x`` (17 characters): ~0.3 µs for a
15 KB record against ~65-85 µs for the BLAKE2b of earlier versions, which was ~20 % of the
worker's event loop (docs/performance.md). It guards against accidents (a producer that sends
two different outputs under one key), not against an adversary: whoever can write records can
write a conflicting one under any key anyway.

Workers of earlier versions stored BLAKE2b's 16 hex digits (:func:`legacy_record_digest`).
A trajectory filed by such a worker may still be in Redis when this one reads a record of it
again, so ``store`` (``lua/store.lua``) is given both forms and compares a stored digest with
the one of its own form. Workers of two versions never serve one namespace at once (the
namespace's scoring fingerprint names the rewardq version), so no earlier worker meets a tagged
digest. ``claim`` (``lua/claim.lua``) files a trajectory nobody has filed yet: the tagged form only.
"""

from __future__ import annotations

import hashlib

import xxhash

__all__ = ["legacy_record_digest", "record_digest"]


def _raw(data: object) -> bytes | bytearray | memoryview:
    return data if isinstance(data, (bytes, bytearray, memoryview)) else b""


def record_digest(data: object) -> str:
    """The digest a worker stores for a record's bytes: ``x`` + XXH3-64 in 16 hex digits."""
    return "x" + xxhash.xxh3_64_hexdigest(_raw(data))


def legacy_record_digest(data: object) -> str:
    """The digest workers of earlier versions stored: 16 hex digits of BLAKE2b (never starting ``x``)."""
    return hashlib.blake2b(_raw(data), digest_size=8).hexdigest()
