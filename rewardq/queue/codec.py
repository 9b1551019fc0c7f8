"""The wire format of one output record: versioned msgpack, token ids as packed arrays.

A record is a msgpack map::

    {"v": 1, "uid": str, "session_id": str, "index": 0 <= int < max_outputs, "final": bool,
     "prompt_ids": Ext(1|2), "response_ids": Ext(1|2), "response_mask": Ext(4) | nil,
     "response_logprobs": Ext(3) | nil, "num_turns": int | nil, "extra_fields": map,
     "reward_score": float | nil, "sample": map, "multi_modal_data": map (only when present),
     "tokenizer": str (optional)}

Token ids travel as msgpack extension types holding little-endian packed arrays
(ext 1: int32, ext 2: int64, ext 3: float32, ext 4: uint8), never as lists of Python
ints and never as pickle. Images travel as their encoded bytes (PNG/JPEG/WebP) in msgpack
binary, each bounded by ``max_image_bytes`` (:mod:`rewardq.queue.images`, which also reads the
sample's ``multi_modal_data`` column). Decoding is bounded by ``max_bytes`` and validates every
field; a failure raises :class:`~rewardq.errors.RecordError` naming the field. The producer
checks exactly what the decoder accepts (``check_value`` mirrors the unpacker's limits), so a
record the producer sent is never refused by a worker of the same version (the checks live in
:mod:`rewardq.queue.checks`).

``tokenizer`` is present only when the producer knows it: the fingerprint of the tokenizer
that made the ids (:mod:`rewardq.reward.tokenizer_fingerprint`). A worker given its own refuses a record
made with another vocabulary (:class:`~rewardq.errors.TokenizerMismatch`, naming both).

Keys are ``<uid>_<session_id>_<index>`` and parse from the right: a ``session_id`` never holds
``_`` (a ``uid`` may), so two trajectories never share a key.

The encoding is deterministic (the same output always gives the same bytes), so a record
delivered twice is recognised as the same record, and two *different* records for one key
as a conflict. The producer's timestamp therefore travels beside the payload, in the
stream entry's ``ts`` field, not inside it.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from rewardq.errors import RecordError, TokenizerMismatch
from rewardq.queue.checks import (
    MAX_ARRAY_LEN,
    MAX_MAP_LEN,
    MAX_OUTPUTS,
    MAX_RECORD_BYTES,
    check_dict,
    check_finite,
    check_index,
    check_mask,
    check_name,
    check_score,
    check_tokenizer,
    check_unique_fields,
    tokenizer_mismatch,
)
from rewardq.queue.images import MAX_IMAGE_BYTES, decode_multi_modal, encode_multi_modal, with_sample_media
from rewardq.queue.keys import output_key, trajectory_id
from rewardq.queue.token_arrays import as_id_array
from rewardq.queue.token_arrays import as_logprobs as _as_logprobs
from rewardq.queue.token_arrays import as_mask as _as_mask

SCHEMA_VERSION = 1
#: The record limits a decoder applies unless told otherwise (:mod:`rewardq.queue.checks`, :mod:`.images`).
DEFAULT_MAX_RECORD_BYTES = MAX_RECORD_BYTES
DEFAULT_MAX_OUTPUTS = MAX_OUTPUTS
DEFAULT_MAX_IMAGE_BYTES = MAX_IMAGE_BYTES

EXT_INT32, EXT_INT64, EXT_FLOAT32, EXT_UINT8 = 1, 2, 3, 4
_EXT_DTYPES: dict[int, np.dtype[Any]] = {
    EXT_INT32: np.dtype("<i4"),
    EXT_INT64: np.dtype("<i8"),
    EXT_FLOAT32: np.dtype("<f4"),
    EXT_UINT8: np.dtype("u1"),
}
_REQUIRED = ("uid", "session_id", "index", "final", "prompt_ids", "response_ids")
_KNOWN = frozenset(
    _REQUIRED
    + ("v", "response_mask", "response_logprobs", "num_turns", "extra_fields", "reward_score", "sample")
    + ("multi_modal_data", "tokenizer")
)


@dataclass(slots=True)
class OutputRecord:
    """One output of a trajectory, decoded. Arrays are read-only views on the payload."""

    uid: str
    session_id: str
    index: int
    final: bool
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    response_mask: np.ndarray | None = None
    response_logprobs: np.ndarray | None = None
    num_turns: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)
    reward_score: float | None = None
    sample: dict[str, Any] = field(default_factory=dict)
    #: the output's images (:class:`~rewardq.queue.images.EncodedImage`) and video paths, if any
    multi_modal_data: dict[str, list[Any]] | None = None
    tokenizer: str | None = None

    @property
    def key(self) -> str:
        return output_key(self.uid, self.session_id, self.index)

    @property
    def tid(self) -> str:
        return trajectory_id(self.uid, self.session_id)


# --------------------------------------------------------------------------------------
# packed arrays on the wire, plain values
# (what producers hand over becomes checked arrays in rewardq.queue.token_arrays)
# --------------------------------------------------------------------------------------


#: The extension type code of each packed dtype (the inverse of ``_EXT_DTYPES``).
_EXT_CODES: dict[np.dtype[Any], int] = {dtype: code for code, dtype in _EXT_DTYPES.items()}


def _ext(arr: np.ndarray) -> msgpack.ExtType:
    return msgpack.ExtType(_EXT_CODES[arr.dtype], arr.tobytes())


def _ext_hook(code: int, data: bytes) -> object:
    dtype = _EXT_DTYPES.get(code)
    if dtype is None:
        raise RecordError("<record>", f"unknown msgpack extension type {code}")
    if len(data) % dtype.itemsize:
        raise RecordError("<record>", f"packed array of {len(data)} bytes is not a whole number of {dtype}")
    return np.frombuffer(data, dtype=dtype)


def plain_value(obj: object) -> object:
    """msgpack ``default`` hook for values in ``sample`` / ``extra_fields``: numpy and torch values
    as Python numbers and lists, sets and tuples as lists; anything else raises TypeError."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "detach") and hasattr(obj, "tolist"):
        return obj.detach().cpu().tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot serialise a value of type {type(obj).__name__}")


# --------------------------------------------------------------------------------------
# producer side
# --------------------------------------------------------------------------------------


#: The largest ``num_turns``: an int32, as the ledger's column holds it (no agent loop comes near).
MAX_TURNS = 2**31 - 1


#: The fields of an output the producer reads (the rest of a verl ``AgentLoopOutput`` is not sent).
OUTPUT_FIELDS = frozenset(
    (
        "prompt_ids",
        "response_ids",
        "response_mask",
        "response_logprobs",
        "num_turns",
        "multi_modal_data",
        "extra_fields",
        "reward_score",
    )
)


def _refuse_misspelt_fields(output: Mapping[Any, object]) -> None:
    """Refuse a dict key that is a near miss of a field the producer reads (``respone_mask``): the
    field would otherwise be dropped without a word (a lost mask counts tool tokens as the model's).
    Other keys pass, as verl's other ``AgentLoopOutput`` fields do; none of those is a near miss."""
    for key in output.keys() - OUTPUT_FIELDS:
        if isinstance(key, str):
            near = difflib.get_close_matches(key, OUTPUT_FIELDS, n=1, cutoff=0.8)
            if near:
                raise RecordError(key, f"is not a field of an output; did you mean {near[0]!r}?")


def _getter(output: object) -> Callable[[str], object]:
    """How to read a field of ``output`` (None when absent): a dict's ``get`` or the object's
    attribute. Decided once per output: ``isinstance(output, Mapping)`` is an ABC check that costs
    ~0.4 µs for an object that is no mapping (verl's ``AgentLoopOutput``), and a record reads 8 fields."""
    if isinstance(output, Mapping):
        _refuse_misspelt_fields(output)
        return output.get
    return lambda name: getattr(output, name, None)


def encode_output(
    uid: object,
    session_id: object,
    index: object,
    output: object,
    sample: Mapping[str, object] | None,
    *,
    final: bool,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_outputs: int = DEFAULT_MAX_OUTPUTS,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    tokenizer: str | None = None,
) -> bytes:
    """Validate one output and encode it for the wire.

    ``output`` is a dict with the fields of a verl ``AgentLoopOutput`` or any object with
    those attributes (its ``multi_modal_data`` images are encoded once, here); ``tokenizer`` the
    fingerprint of the tokenizer that made its ids, if known. Raises RecordError naming the first
    bad field and, once ``uid``, ``session_id`` and ``index`` are valid, the output's key
    (``"prompt_ids: token id -2 is negative (output u_s_3)"``), so a bad output among many is found.
    """
    uid = check_name(uid, "uid")
    session_id = check_name(session_id, "session_id")
    index = check_index(index, max_outputs)
    where = f"output {output_key(uid, session_id, index)}"
    try:
        data = _packed_record(uid, session_id, index, output, sample, final, max_image_bytes, tokenizer)
    except RecordError as exc:
        raise exc.naming(where) from None
    if len(data) > max_bytes:
        raise RecordError(
            "<record>",
            f"encoded size {len(data)} bytes exceeds max_record_bytes={max_bytes}; "
            "raise the limit on producers and workers or send fewer tokens",
        ).naming(where)
    return data


def _packed_record(
    uid: str,
    session_id: str,
    index: int,
    output: object,
    sample: Mapping[str, object] | None,
    final: object,
    max_image_bytes: int,
    tokenizer: str | None,
) -> bytes:
    """The checked fields of one output, packed (:func:`encode_output`; RecordError names the field)."""
    if not isinstance(final, bool):
        raise RecordError("final", f"must be True or False, got {type(final).__name__}")
    if output is None:
        raise RecordError("output", "is None; an output is a dict or an object with prompt_ids and response_ids")
    get = _getter(output)
    prompt = as_id_array(get("prompt_ids"), "prompt_ids")
    response = as_id_array(get("response_ids"), "response_ids")
    mask = _as_mask(get("response_mask"), response.shape[0])
    logprobs = _as_logprobs(get("response_logprobs"), response.shape[0])
    num_turns = get("num_turns")
    if num_turns is not None and (
        isinstance(num_turns, bool) or not isinstance(num_turns, (int, np.integer)) or not 0 <= num_turns <= MAX_TURNS
    ):
        raise RecordError(
            "num_turns",
            f"must be a non-negative integer of at most {MAX_TURNS} (int32) or None, got {str(num_turns)[:40]}",
        )
    media = encode_multi_modal(get("multi_modal_data"), output=index, max_image_bytes=max_image_bytes)
    sample = with_sample_media(sample, output=index, max_image_bytes=max_image_bytes, decode=False)
    record = {
        "v": SCHEMA_VERSION,
        "uid": uid,
        "session_id": session_id,
        "index": index,
        "final": final,
        "prompt_ids": _ext(prompt),
        "response_ids": _ext(response),
        "response_mask": None if mask is None else _ext(mask),
        "response_logprobs": None if logprobs is None else _ext(logprobs),
        "num_turns": None if num_turns is None else int(num_turns),
        "extra_fields": check_dict(get("extra_fields"), "extra_fields"),
        "reward_score": check_score(get("reward_score")),
        "sample": check_dict(sample, "sample"),
    }
    if media is not None:  # absent otherwise: a text-only record keeps its bytes (and digest)
        record["multi_modal_data"] = media
    if tokenizer is not None:  # absent otherwise: a record without it encodes as it always did
        record["tokenizer"] = check_tokenizer(tokenizer)
    try:
        data: bytes = msgpack.packb(record, default=plain_value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        field_name = "sample" if "sample" in str(exc) else "extra_fields/sample"
        raise RecordError(
            field_name, f"holds a value msgpack cannot carry ({exc}); use plain str/int/float/bool/list/dict values"
        ) from None
    return data


# --------------------------------------------------------------------------------------
# worker side
# --------------------------------------------------------------------------------------


def _need(d: dict[str, object], name: str, types: type | tuple[type, ...], what: str) -> Any:
    if name not in d:
        raise RecordError(name, "is missing")
    value = d[name]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise RecordError(name, f"must be {what}, got bool")
    if not isinstance(value, types):
        raise RecordError(name, f"must be {what}, got {type(value).__name__}")
    return value


def _ids(d: dict[str, object], name: str) -> np.ndarray:
    """A required packed integer array (``prompt_ids``, ``response_ids``)."""
    arr = _array(d, name, ("i",), required=True)
    if arr is None:  # _array raised already; this keeps the type checker informed
        raise RecordError(name, "is missing")
    return arr


def _array(d: dict[str, object], name: str, kinds: tuple[str, ...], *, required: bool) -> np.ndarray | None:
    value = d.get(name)
    if value is None:
        if required:
            raise RecordError(name, "is missing")
        return None
    if not isinstance(value, np.ndarray) or value.dtype.kind not in kinds:
        raise RecordError(
            name,
            f"must be a packed {'integer' if 'i' in kinds else 'number'} array "
            f"(msgpack ext), got {type(value).__name__}",
        )
    return value


def _ids_in_range(arr: np.ndarray, vocab_size: int | None) -> bool:
    """``0 <= id < vocab_size`` for every id, in one pass: negative ids read as unsigned are
    larger than any vocabulary. Without a vocabulary only the sign is checked."""
    if vocab_size is None:
        return int(arr.min()) >= 0
    unsigned = arr.view(np.uint32 if arr.dtype.itemsize == 4 else np.uint64)
    return int(unsigned.max()) < vocab_size


def decode_output(  # noqa: C901 - one check per wire field, in field order
    data: object,
    *,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    vocab_size: int | None = None,
    max_outputs: int = DEFAULT_MAX_OUTPUTS,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    tokenizer: str | None = None,
) -> OutputRecord:
    """Decode and validate one record. Raises RecordError naming the bad field.

    ``tokenizer``: the worker's tokenizer fingerprint; a record made with another vocabulary is
    refused (field ``tokenizer``) before its ids are checked against ``vocab_size``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RecordError("data", f"stream entry has no binary 'data' field (got {type(data).__name__})")
    if len(data) > max_bytes:
        raise RecordError("<record>", f"size {len(data)} bytes exceeds max_record_bytes={max_bytes}")
    try:
        d = msgpack.unpackb(
            data,
            raw=False,
            ext_hook=_ext_hook,
            strict_map_key=True,
            max_bin_len=max_bytes,
            max_str_len=max_bytes,
            max_ext_len=max_bytes,
            max_array_len=MAX_ARRAY_LEN,
            max_map_len=MAX_MAP_LEN,
        )
    except RecordError:
        raise
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types for garbage input; each is a bad record
        detail = str(exc) or f"its bytes start {bytes(data[:16])!r}"  # msgpack's FormatError says nothing
        raise RecordError("<record>", f"not a valid msgpack record ({type(exc).__name__}: {detail})") from None
    if not isinstance(d, dict):
        raise RecordError("<record>", f"expected a msgpack map, got {type(d).__name__}")
    check_unique_fields(data, d)
    version = d.get("v")
    if version != SCHEMA_VERSION:
        raise RecordError(
            "v",
            f"unknown schema version {version!r}; this worker understands "
            f"{SCHEMA_VERSION}. Run the same rewardq version on producers and workers",
        )
    if not _KNOWN.issuperset(d):
        extra = set(d) - _KNOWN
        raise RecordError(sorted(extra)[0], f"unknown field(s) {sorted(extra)}; producer and worker versions disagree")
    uid = check_name(_need(d, "uid", str, "a string"), "uid")
    session_id = check_name(_need(d, "session_id", str, "a string"), "session_id")
    index = check_index(_need(d, "index", int, "an integer"), max_outputs)
    final = _need(d, "final", bool, "a bool")
    made_with = check_tokenizer(d.get("tokenizer"))
    wrong = tokenizer_mismatch(made_with, tokenizer)
    if wrong is not None:
        raise TokenizerMismatch(wrong)
    prompt = _ids(d, "prompt_ids")
    response = _ids(d, "response_ids")
    for name, arr in (("prompt_ids", prompt), ("response_ids", response)):
        if arr.size and not _ids_in_range(arr, vocab_size):
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0:
                raise RecordError(name, f"token id {lo} is negative")
            raise RecordError(name, f"token id {hi} is out of range for a vocabulary of {vocab_size}")
    mask = _array(d, "response_mask", ("u", "i"), required=False)
    if mask is not None:
        mask = check_mask(mask, response.shape[0])
    logprobs = _array(d, "response_logprobs", ("f",), required=False)
    if logprobs is not None and logprobs.shape[0] != response.shape[0]:
        raise RecordError(
            "response_logprobs", f"has {logprobs.shape[0]} entries but response_ids has {response.shape[0]}"
        )
    if logprobs is not None:
        check_finite(logprobs)
    num_turns = d.get("num_turns")
    if num_turns is not None and (
        isinstance(num_turns, bool) or not isinstance(num_turns, int) or not 0 <= num_turns <= MAX_TURNS
    ):
        raise RecordError(
            "num_turns", f"must be a non-negative integer of at most {MAX_TURNS} (int32) or nil, got {num_turns!r}"
        )
    extra_fields = d.get("extra_fields") or {}
    if not isinstance(extra_fields, dict):
        raise RecordError("extra_fields", f"must be a map, got {type(extra_fields).__name__}")
    sample = d.get("sample") or {}
    if not isinstance(sample, dict):
        raise RecordError("sample", f"must be a map, got {type(sample).__name__}")
    score = d.get("reward_score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
        raise RecordError("reward_score", f"must be a number or nil, got {type(score).__name__}")
    if score is not None and not math.isfinite(score):
        raise RecordError("reward_score", f"is {score}; it must be a finite number or nil")
    media = decode_multi_modal(d.get("multi_modal_data"), output=index, max_image_bytes=max_image_bytes)
    sample = with_sample_media(sample, output=index, max_image_bytes=max_image_bytes, decode=True)
    return OutputRecord(
        uid=uid,
        session_id=session_id,
        index=index,
        final=final,
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        response_logprobs=logprobs,
        num_turns=num_turns,
        extra_fields=extra_fields,
        reward_score=None if score is None else float(score),
        sample=sample,
        multi_modal_data=media,
        tokenizer=made_with,
    )


#: :func:`peek_identity` reads at most this many leading bytes of a rejected record.
PEEK_BYTES = 64 * 1024


def peek_identity(data: Any) -> tuple[str, str, int] | None:
    """Best-effort ``(uid, session_id, index)`` of a record that failed validation.

    Lets the worker write an error result for the keys of a rejected record. The uid and
    session id must pass :func:`check_name`; an index that is not a non-negative integer is
    given as -1 (unknown). Returns None when even the names cannot be read, or when the record
    gives one of them twice with two values (it names two keys: the caller then answers the key
    the stream entry names, if any, rather than guess). Only the first
    :data:`PEEK_BYTES` bytes are looked at (the encoder writes the identity first), so an
    oversize or hostile record costs no more than that to peek at.
    """
    try:
        unpacker = msgpack.Unpacker(
            raw=False, strict_map_key=False, ext_hook=lambda c, b: None, max_buffer_size=PEEK_BYTES
        )
        unpacker.feed(bytes(memoryview(data)[:PEEK_BYTES]))
        found: dict[str, Any] = {}
        try:
            for _ in range(min(unpacker.read_map_header(), 32)):
                name = unpacker.unpack()
                if name in ("uid", "session_id", "index"):
                    value = unpacker.unpack()
                    if name in found and found[name] != value:
                        return None  # the field twice, with two values: no identity can be trusted
                    found[name] = value
                else:
                    unpacker.skip()
        except msgpack.OutOfData:  # past the peeked bytes (token ids): what was read is the identity
            pass
        uid, sid, idx = found["uid"], found["session_id"], found.get("index")
        if not isinstance(uid, str) or not isinstance(sid, str):
            return None
        uid, sid = check_name(uid, "uid"), check_name(sid, "session_id")
    except Exception:  # noqa: BLE001 - anything unreadable means "no identity"
        return None
    if isinstance(idx, int) and not isinstance(idx, bool) and idx >= 0:
        return uid, sid, idx
    return uid, sid, -1
