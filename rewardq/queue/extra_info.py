"""``reward_extra_info`` as it is stored: checked once, then compact JSON in UTF-8, bounded in bytes.

A reward function or a custom manager may return anything as extra info. :func:`encode_extra_info`
walks it once, building the plain copy ``json.dumps`` then encodes, and refuses (with
:class:`~rewardq.errors.ResultError` naming the path) what cannot be stored faithfully:

* a **cycle** (a dict or list that contains itself): ``reward_extra_info.self refers back to
  reward_extra_info``;
* nesting deeper than :data:`MAX_DEPTH` levels;
* two keys that become **one JSON key** (``1`` and ``"1"``, ``True`` and ``"true"``): JSON object
  keys are strings, and keeping one would silently drop the other;
* a value whose ``str()`` raises, or an integer larger than any float (``10**400``): Python's
  ``json`` would write all its digits, and a trainer that averages the field (``np.mean``) or a
  reader in another language could not take it as a number;
* more than ``limit`` bytes. The walk counts as it goes and stops as soon as the value is
  certainly over the limit, so a 10 GB string or a 10⁹-element array costs no more than the limit
  to refuse, never the allocation of its JSON.

What it converts instead: numpy and torch scalars and arrays to numbers and lists; tuples and sets
to lists; other non-string keys the way ``json`` does (``1`` -> ``"1"``, ``None`` -> ``"null"``);
lone surrogates to U+FFFD (UTF-8 cannot hold them); any other object to its ``str()``.

NaN and ±inf stay **numbers**: they are written as ``NaN``, ``Infinity`` and ``-Infinity``, the
tokens Python's ``json`` (and so :class:`~rewardq.queue.results.RewardResult`, the verl adapter,
the ledger's readers) reads back as floats. So a trainer averaging ``acc`` over a batch meets a
float NaN (its mean is NaN, which says what happened), never a string that breaks ``np.mean``.
A strict JSON parser outside Python (``JSON.parse``, ``jq``) refuses these tokens: docs/keyspace.md
says so. A NaN as a dict *key* becomes the key ``"nan"`` (``"inf"``, ``"-inf"``).

The walk is recursive, bounded by :data:`MAX_DEPTH` (far below Python's recursion limit), and
costs ~0.1 µs per value: a typical extra info (a handful of numbers and short strings) is
checked and encoded in a few µs (``benchmarks`` and ``tests/unit/test_extra_info.py`` measure it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rewardq.errors import ResultError
from rewardq.queue.text import utf8

#: Deepest nesting of dicts and lists in one ``reward_extra_info`` (the dict itself is level 1).
MAX_DEPTH = 64
#: Integers with more bits than this may be larger than any float (about 1.8e308), which is refused
#: (the module doc); 1,024 bits hold every integer a float can.
MAX_INT_BITS = 1024


class _Bad(Exception):
    """A value that cannot be stored; ``path`` is filled in (innermost first) as the walk unwinds."""

    def __init__(self, reason: str, refers_to: int | None = None) -> None:
        self.reason = reason
        self.refers_to = refers_to  # a cycle: the depth of the value it refers back to
        self.path: list[str] = []


class _TooBig(Exception):
    pass


class _Walk:
    """The state of one walk: bytes still allowed, and the containers on the current path."""

    __slots__ = ("left", "ancestors")

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.ancestors: dict[int, int] = {}  # id -> depth of the dicts / lists being walked

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _TooBig


def _key_text(k: object) -> str:
    """A non-string dict key as ``json`` would write it."""
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, int):
        if k.bit_length() > 4 * MAX_INT_BITS:  # Python writes no int of over 4,300 digits
            raise _Bad(f"has an integer key of {k.bit_length():,} bits; use a shorter key")
        return str(int(k))
    if isinstance(k, float):
        return repr(k) if math.isfinite(k) else str(k)
    if isinstance(k, np.generic):
        return _key_text(k.item())
    try:
        return str(k)
    except Exception as exc:  # noqa: BLE001 - a hostile __str__: name it
        raise _Bad(f"has a {type(k).__name__} key whose str() raised {type(exc).__name__}") from None


def _label(k: object) -> str:
    return k if isinstance(k, str) else repr(k)


def _float(v: float, w: _Walk) -> object:
    w.spend(24)
    return v  # NaN and ±inf included: json writes them as NaN / Infinity (module doc)


def _int(v: int, w: _Walk) -> int:
    bits = v.bit_length()
    if bits >= MAX_INT_BITS and not _fits_a_float(v):
        raise _Bad(
            f"is an integer of {bits:,} bits (about {round(bits * math.log10(2)):,} digits), larger than any "
            "float: a trainer reading the field as a number would fail; return a float or a string"
        )
    w.spend(bits // 3 + 2)
    return int(v)


def _fits_a_float(v: int) -> bool:
    try:
        float(v)
    except OverflowError:
        return False
    return True


def _mapping(v: Mapping[object, object], depth: int, w: _Walk) -> dict[str, object]:
    out: dict[str, Any] = {}
    converted = False
    w.spend(2)
    for k, item in v.items():
        if type(k) is str:
            sk = k
        else:
            sk, converted = _key_text(k), True
        w.spend(len(sk) + 4)
        try:
            out[sk] = _plain(item, depth + 1, w)
        except _Bad as exc:
            exc.path.append(f".{_label(k)}")
            raise
    if converted and len(out) != len(v):
        seen: dict[str, list[Any]] = {}
        for k in v:
            seen.setdefault(k if type(k) is str else _key_text(k), []).append(k)
        sk, ks = next((s, ks) for s, ks in seen.items() if len(ks) > 1)
        raise _Bad(
            f"has the keys {' and '.join(repr(k) for k in ks)}, which JSON writes as one key, {json.dumps(sk)}: "
            "one would silently replace the other; use distinct string keys"
        )
    return out


def _sequence(v: Any, depth: int, w: _Walk) -> list[object]:
    w.spend(2)
    out = []
    for i, item in enumerate(v):
        w.spend(1)
        try:
            out.append(_plain(item, depth + 1, w))
        except _Bad as exc:
            exc.path.append(f"[{i}]")
            raise
    return out


def _container(v: object, depth: int, w: _Walk) -> object:
    if depth >= MAX_DEPTH:
        raise _Bad(f"nests dicts/lists deeper than {MAX_DEPTH} levels")
    vid = id(v)
    if vid in w.ancestors:
        raise _Bad("refers back to", refers_to=w.ancestors[vid])
    w.ancestors[vid] = depth
    try:
        return _mapping(v, depth, w) if isinstance(v, Mapping) else _sequence(v, depth, w)
    finally:
        del w.ancestors[vid]


def _array(v: Any, depth: int, w: _Walk) -> object:
    """A numpy / torch value, its size checked before ``tolist`` allocates it."""
    size = v.numel() if hasattr(v, "numel") else int(getattr(v, "size", 1))
    w.spend(int(size))  # at least one byte per element
    if hasattr(v, "detach"):
        v = v.detach().cpu()
    return _plain(v.tolist(), depth, w)


def _plain(v: Any, depth: int, w: _Walk) -> object:
    """The plain-JSON copy of ``v`` (see the module doc)."""
    t = type(v)
    if t is str:
        w.spend(len(v) + 2)
        return v
    if t is float:
        return _float(v, w)
    if t is bool or v is None:
        w.spend(5)
        return v
    if t is int:
        return _int(v, w)
    if t is dict or t is list or t is tuple or isinstance(v, (Mapping, list, tuple, set, frozenset)):
        return _container(v, depth, w)
    return _other(v, depth, w)


def _other(v: object, depth: int, w: _Walk) -> object:
    """What is neither a plain scalar nor a container: arrays, subclasses, anything with a ``str()``."""
    t = type(v)
    if isinstance(v, (np.ndarray, np.generic)) or (hasattr(v, "tolist") and hasattr(v, "numel")):
        try:
            return _array(v, depth, w)
        except (_Bad, _TooBig):
            raise
        except Exception as exc:  # noqa: BLE001 - an array-like whose tolist fails: name it
            raise _Bad(f"is a {t.__name__} that could not be read as a list ({type(exc).__name__})") from None
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return _int(int(v), w)
    if isinstance(v, float):
        return _float(float(v), w)
    if isinstance(v, str):
        return _plain(str.__str__(v), depth, w)
    if hasattr(v, "item"):
        try:
            item = v.item()
        except Exception:  # noqa: BLE001 - not a scalar after all: its text below
            item = v
        if type(item) in (str, float, int, bool) or item is None:
            return _plain(item, depth, w)
    try:
        text = str(v)
    except Exception as exc:  # noqa: BLE001 - a hostile __str__: name it
        raise _Bad(f"is a {t.__name__} whose str() raised {type(exc).__name__}") from None
    return _plain(text, depth, w)


def _path(parts: list[str], upto: int | None = None) -> str:
    """``reward_extra_info.a.b[2]`` from the components gathered while unwinding (innermost first);
    a deep path shows its first and last few components."""
    inner = list(reversed(parts))[:upto]
    if len(inner) > 10:
        inner = [*inner[:5], f"...({len(inner) - 8} more)...", *inner[-3:]]
    return "reward_extra_info" + "".join(inner)


def encode_extra_info(value: object, limit: int) -> bytes:
    """``value`` as stored: compact JSON, UTF-8, at most ``limit`` bytes (the worker's ``max_result_bytes``).

    Raises :class:`~rewardq.errors.ResultError` naming the path and the problem (see the module doc).
    """
    w = _Walk(limit)
    try:
        plain = _plain(value, 0, w)
    except _TooBig:
        raise ResultError(
            f"reward_extra_info takes at least {limit - w.left:,} bytes of JSON, over max_result_bytes={limit:,}; "
            "return less reward_extra_info, or raise max_result_bytes on the workers"
        ) from None
    except RecursionError:  # a str() or tolist() of user code that recursed: nothing of ours does
        raise ResultError("reward_extra_info holds a value whose conversion recursed without end") from None
    except _Bad as exc:
        where = _path(exc.path)
        if exc.refers_to is not None:
            raise ResultError(
                f"{where} refers back to {_path(exc.path, exc.refers_to)}, which contains it (a cycle); "
                "reward_extra_info must be a tree of plain values"
            ) from None
        raise ResultError(f"{where} {exc.reason}") from None
    try:
        text = json.dumps(plain, ensure_ascii=False, separators=(",", ":"), allow_nan=True, check_circular=False)
    except (ValueError, TypeError, RecursionError) as exc:  # the walk made it plain; kept as a last guard
        raise ResultError(f"reward_extra_info cannot be written as JSON ({type(exc).__name__}: {exc})") from None
    data = utf8(text)
    if len(data) > limit:
        raise ResultError(
            f"reward_extra_info is {len(data):,} bytes of JSON, over max_result_bytes={limit:,}; "
            "return less reward_extra_info, or raise max_result_bytes on the workers"
        )
    return data
