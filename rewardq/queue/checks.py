"""Field checks shared by the producer (before encoding) and the worker (after decoding).

One definition of what a record may hold, so a producer never sends what a worker of the same
version refuses: names, counted in bytes as Redis counts them (:func:`check_name`), the output
index (:func:`check_index`), the response mask (:func:`check_mask`), finite numbers
(:func:`check_score`, :func:`check_finite`), the nested ``sample`` / ``extra_fields`` values
(:func:`check_value`, which mirrors the msgpack unpacker's limits below), a record map without a
field given twice (:func:`check_unique_fields`), a trajectory's total size
(:func:`check_trajectory_bytes`) and the tokenizer fingerprint (:func:`check_tokenizer`,
:func:`tokenizer_mismatch`). Each raises :class:`~rewardq.errors.RecordError` naming the field.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from rewardq.errors import RecordError, TrajectoryTooLarge
from rewardq.queue.keys import MAX_SESSION_ID_BYTES, MAX_UID_BYTES

#: Largest encoded record, in bytes: producers refuse larger ones, workers dead-letter them.
MAX_RECORD_BYTES = 32 * 1024 * 1024
#: Outputs one trajectory may have (indices 0 .. MAX_OUTPUTS - 1). Producers refuse a larger index,
#: workers reject it, and every Lua script is given it as the bound of its loops, so no record can
#: make a script's work grow past it.
MAX_OUTPUTS = 4096
#: Largest sum of the encoded records of one trajectory, in bytes. ``put_trajectory`` refuses a
#: larger trajectory before anything is written; workers stop storing a trajectory's outputs once
#: they pass it and give every key an error result. A trajectory of this size decodes to about as
#: much worker memory, so it bounds what one trajectory can cost Redis and a worker. 256 MiB is
#: 8 records of the largest size (``MAX_RECORD_BYTES``), or 4,096 outputs of ~16k tokens each,
#: far past the agent trajectories of a real run (tens of MB at most).
MAX_TRAJECTORY_BYTES = 256 * 1024 * 1024


#: Longest list and largest map the decoder unpacks (msgpack's ``max_array_len`` / ``max_map_len``).
MAX_ARRAY_LEN = 1_000_000
MAX_MAP_LEN = 100_000
#: Deepest nesting of lists and maps in a record (msgpack's packer and unpacker both stop at 1024).
MAX_DEPTH = 1024


def check_finite(arr: np.ndarray) -> None:
    if arr.size and not bool(np.isfinite(arr).all()):
        bad = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise RecordError("response_logprobs", f"entry {bad} is {arr[bad]}; log-probabilities must be finite")


def check_name(value: object, name: str) -> str:
    """Validate a ``uid`` or ``session_id`` (an int is taken as its decimal text).

    Both are non-empty UTF-8 text without newlines or NUL, at most ``MAX_UID_BYTES`` /
    ``MAX_SESSION_ID_BYTES`` bytes of UTF-8 long (Redis counts key lengths in bytes, and so does
    every limit on a key, at both ends); a ``session_id`` holds no ``_``, so keys parse from the right.

    A string that passed is remembered (:func:`_checked_text`): the outputs of one trajectory
    carry the same two names, and a worker checks every record.
    """
    if type(value) is str:
        return _checked_text(value, name)
    if isinstance(value, bool) or not isinstance(value, (str, int, np.integer)):
        raise RecordError(name, f"must be a string, got {type(value).__name__}")
    return _check_text(str(value), name)


@functools.lru_cache(maxsize=4096)
def _checked_text(value: str, name: str) -> str:
    """:func:`_check_text` of the names seen lately (a refused name raises and is not kept)."""
    return _check_text(value, name)


def _check_text(value: str, name: str) -> str:
    if not value:
        raise RecordError(name, "must not be empty")
    limit = MAX_SESSION_ID_BYTES if name == "session_id" else MAX_UID_BYTES
    if len(value) > limit:  # at least that many bytes: refused without encoding a huge value
        raise RecordError(name, f"is {len(value)} characters long; at most {limit} bytes of UTF-8 are allowed")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise RecordError(name, "must be valid UTF-8 text (it holds a lone surrogate)") from None
    if size > limit:
        raise RecordError(
            name, f"is {size} bytes of UTF-8 ({len(value)} characters); at most {limit} bytes are allowed"
        )
    if any(c in value for c in "\r\n\x00"):
        raise RecordError(name, "must not contain newlines or NUL characters")
    if name == "session_id" and "_" in value:
        raise RecordError(
            name,
            f"{value!r} contains '_'; session ids may not (keys are <uid>_<session_id>_<index> and "
            "parse from the right, so '_' would let two trajectories share a key). Use e.g. '-'",
        )
    return value


def check_mask(arr: np.ndarray, n: int) -> np.ndarray:
    """Validate a ``response_mask`` against a response of ``n`` tokens: ``n`` values, each 0 or 1.

    The producer checks it before encoding and the worker after decoding (a raw ``XADD`` may carry
    a mask of 2, 7 or -1), so both ends refuse the same masks. Returns the mask as uint8.
    """
    if arr.shape[0] != n:
        raise RecordError("response_mask", f"has {arr.shape[0]} entries but response_ids has {n}")
    if arr.size:
        # uint8 (what producers send) cannot go below 0: one pass instead of two
        hi = int(arr.max())
        lo = 0 if arr.dtype == np.uint8 else int(arr.min())
        if lo < 0 or hi > 1:
            bad = hi if hi > 1 else lo
            raise RecordError(
                "response_mask",
                f"holds {bad}; it must hold only 0 (tool/observation token) and 1 (model token)",
            )
    return arr.astype(np.uint8, copy=False)


def check_index(value: object, max_outputs: int = MAX_OUTPUTS) -> int:
    """Validate an output index: an integer in ``0 .. max_outputs - 1``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise RecordError("index", f"must be an integer, got {type(value).__name__}")
    if value < 0:
        raise RecordError("index", f"must be >= 0, got {value}")
    if value >= max_outputs:
        raise RecordError(
            "index",
            f"{value} is too large: a trajectory has at most max_outputs={max_outputs} outputs "
            "(indices 0..max_outputs-1); raise max_outputs on producers and workers if that is too few",
        )
    return int(value)


def check_score(value: object, name: str = "reward_score") -> float | None:
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(name, f"must be a number or None, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range (10**400)
        raise RecordError(name, f"is an integer of {len(str(abs(int(value))))} digits, past a float's range") from None
    if not math.isfinite(number):
        raise RecordError(name, f"is {value}; it must be a finite number or None")
    return number


_SCALARS = (str, int, float, bool, type(None), bytes, bytearray)
_SCALAR_TYPES = frozenset(_SCALARS)


def _array_items(v: Any, path: str) -> list[Any] | None:
    """A numpy or torch array's size checked; the items of a numpy object array (verl's non-tensor
    columns hold any Python values, ``raw_prompt`` its chat messages), None for numbers."""
    size = v.size if type(v) is np.ndarray else int(np.prod(getattr(v, "shape", ()) or (1,)))
    if size > MAX_ARRAY_LEN:
        raise RecordError(path, f"has {size} items; at most {MAX_ARRAY_LEN} are allowed")
    return v.tolist() if isinstance(v, np.ndarray) and v.dtype == object else None


def check_value(value: object, name: str) -> None:
    """Check a ``sample`` / ``extra_fields`` value the way the worker's decoder will unpack it.

    Map keys must be ``str`` or ``bytes`` (the decoder's ``strict_map_key``), lists hold at most
    :data:`MAX_ARRAY_LEN` items, maps :data:`MAX_MAP_LEN`, nesting is at most :data:`MAX_DEPTH`
    deep, and no msgpack extension values. Raises RecordError naming the path, e.g.
    ``sample.reward_model.ground_truth[2]``. Walks iteratively: deep nesting cannot overflow.
    """
    stack: list[tuple[Any, str, int]] = [(value, name, 1)]
    while stack:
        v, path, depth = stack.pop()
        kind = type(v)
        if kind in _SCALAR_TYPES or isinstance(v, _SCALARS):  # the exact types first: one set lookup
            continue
        if isinstance(v, msgpack.ExtType):
            raise RecordError(path, "is a msgpack extension value; use plain str/int/float/bool/list/dict values")
        if depth > MAX_DEPTH - 1:  # the record map itself is one level
            raise RecordError(path, f"nests lists/dicts deeper than {MAX_DEPTH - 1} levels")
        if kind is dict or isinstance(v, Mapping):
            if len(v) > MAX_MAP_LEN:
                raise RecordError(path, f"has {len(v)} keys; at most {MAX_MAP_LEN} are allowed")
            for k, item in v.items():
                text = type(k) is str or isinstance(k, str)  # the exact type first: no isinstance call
                if not text and not isinstance(k, bytes):
                    raise RecordError(path, f"keys must be strings, got {type(k).__name__} key {k!r}")
                label = k if text else repr(k)
                stack.append((item, f"{path}.{label}", depth + 1))
            continue
        if isinstance(v, np.ndarray) or (hasattr(v, "detach") and hasattr(v, "tolist")):
            items = _array_items(v, path)
            if items is not None:  # packed as this list (plain_value), checked as it
                stack.append((items, path, depth))
            continue
        if isinstance(v, (list, tuple, set, frozenset)):
            if len(v) > MAX_ARRAY_LEN:
                raise RecordError(path, f"has {len(v)} items; at most {MAX_ARRAY_LEN} are allowed")
            for i, item in enumerate(v):
                if type(item) not in _SCALAR_TYPES and not isinstance(item, _SCALARS):
                    stack.append((item, f"{path}[{i}]", depth + 1))
            continue


class CheckedDict(dict[str, Any]):
    """A dict :func:`check_dict` accepted already: the sample every output of a trajectory
    carries is checked once for all of them (``producers.core.prepare_trajectory``)."""


def check_dict(value: object, name: str) -> dict[str, object]:
    if type(value) is CheckedDict:
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RecordError(name, f"must be a dict, got {type(value).__name__}")
    for k in value:
        if type(k) is not str and not isinstance(k, str):
            raise RecordError(name, f"keys must be strings, got {type(k).__name__} key {k!r}")
    check_value(value, name)
    return dict(value)


def map_header_size(data: bytes | bytearray | memoryview) -> int | None:
    """The entry count a msgpack map declares in its header (None when ``data`` is no map)."""
    if not data:
        return None
    first = data[0]
    if 0x80 <= first <= 0x8F:
        return first & 0x0F
    if first == 0xDE and len(data) >= 3:
        return int.from_bytes(bytes(data[1:3]), "big")
    if first == 0xDF and len(data) >= 5:
        return int.from_bytes(bytes(data[1:5]), "big")
    return None


def check_unique_fields(data: bytes | bytearray | memoryview, decoded: Mapping[str, object]) -> None:
    """Refuse a record map that holds a field twice (``uid`` twice, say).

    msgpack keeps the last of two equal keys, and a reader that stops at the first one (the
    worker's :func:`~rewardq.queue.codec.peek_identity`, or another language's decoder) would see
    another record: the record is ambiguous, so it is refused whole. Costs O(1): the header's count
    against the decoded map's size.
    """
    declared = map_header_size(data)
    if declared is not None and declared != len(decoded):
        raise RecordError(
            "<record>",
            f"the record map declares {declared} fields but holds {len(decoded)} distinct ones: a field "
            "is given twice, so the record is ambiguous (which uid, which index?); send each field once",
        )


def check_trajectory_bytes(total: int, limit: int, n: int, *, counted: int | None = None) -> None:
    """Refuse a trajectory whose ``n`` encoded records total more than ``max_trajectory_bytes``
    (:class:`~rewardq.errors.TrajectoryTooLarge`, a RecordError for the field ``outputs``).
    ``counted``: how many of the ``n`` records ``total`` covers (a producer stops encoding at the
    first that takes it over)."""
    if total > limit:
        which = f"its {n} outputs encode" if counted in (None, n) else f"the first {counted} of its {n} outputs encode"
        raise TrajectoryTooLarge(
            f"{which} to {total:,} bytes, over max_trajectory_bytes={limit:,}; "
            "send fewer or shorter outputs, or raise max_trajectory_bytes on producers and workers"
        )


#: Longest tokenizer fingerprint a record may carry (``rewardq.reward.tokenizer_fingerprint`` writes ~250 characters).
MAX_TOKENIZER_CHARS = 512


def check_tokenizer(value: object) -> str | None:
    """Validate the optional ``tokenizer`` field: one line of text naming the tokenizer that made the ids."""
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or any(c in value for c in "\r\n\x00")
        or not value
        or len(value) > MAX_TOKENIZER_CHARS
    ):
        raise RecordError(
            "tokenizer",
            f"must be a tokenizer fingerprint (one line of text, at most {MAX_TOKENIZER_CHARS} characters, "
            f"as rewardq.reward.tokenizer_fingerprint.tokenizer_fingerprint writes it), got {value!r:.80}",
        )
    return value


def _vocabulary_part(fingerprint: str) -> str:
    """What identifies a vocabulary in a fingerprint: its ``sha256=`` part (``vocab=`` counts added tokens,
    which transformers and the plain tokenizers library may disagree on; ``name=`` is informative)."""
    return fingerprint.split(" name=", 1)[0].split(" vocab=", 1)[0].strip()


def tokenizer_mismatch(record: str | None, worker: str | None) -> str | None:
    """Why a record made with tokenizer ``record`` must not be decoded by a worker holding ``worker``;
    None when they agree or either is unknown."""
    if record is None or worker is None or _vocabulary_part(record) == _vocabulary_part(worker):
        return None
    return (
        f"wrong tokenizer: the ids were made with the trainer's tokenizer [{record}] but this worker decodes "
        f"with [{worker}], so every reward computed here would come from the wrong text. Start the workers "
        "with the trainer's tokenizer (rewardq worker --tokenizer <the trainer's actor_rollout_ref.model.path>, "
        "or --config with the trainer's config)"
    )
