"""A catalogue of hostile inputs a careless or malicious producer can send past the client.

Each :class:`Case` pushes its input (raw ``XADD`` where the client would refuse it) and says the
exact end state a worker must reach: which keys hold an error result naming which reason, which
keys keep the result they had, and how many dead letters of which kind appear. The integration
suite (``tests/integration/test_hostile.py``) checks every case on the shared Redis; the load test
(``test_hostile_load.py``) interleaves all of them with good trajectories on a throwaway server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from rewardq.queue.checks import MAX_OUTPUTS
from rewardq.queue.codec import encode_output
from rewardq.queue.keys import Keyspace

GOOD = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5]}
OTHER = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6, 7]}
SAMPLE = {"data_source": "test", "reward_model": {"ground_truth": "42"}, "extra_info": {"split": "train"}}


def raw_record(uid: str, sid: str, index: int = 0, *, final: bool = True, **override: Any) -> bytes:
    """A well-formed record's bytes with fields replaced as given (the producer's checks bypassed)."""
    rec = msgpack.unpackb(
        encode_output("u", "s", 0, GOOD, SAMPLE, final=True),
        raw=False,
        ext_hook=lambda c, b: msgpack.ExtType(c, b),
    )
    rec.update(uid=uid, session_id=sid, index=index, final=final)
    rec.update(override)
    packed: bytes = msgpack.packb(rec, use_bin_type=True)
    return packed


def xadd(r: Any, ks: Keyspace, key: str | bytes, data: bytes | None, **extra: Any) -> bytes:
    """One raw stream entry on the shard the key's trajectory maps to (shard 0 when unparseable)."""
    fields: dict[str, Any] = {"key": key, "ts": "0", **extra}
    if data is not None:
        fields["data"] = data
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    shard = ks.shard_of(text.rpartition("_")[0]) if len(text) < 1000 and "_" in text else 0
    entry_id: bytes = r.xadd(ks.stream(shard), fields)
    return entry_id


@dataclass
class Case:
    """One hostile input and the end state it must reach.

    ``before`` (optional) runs first and its keys are scored before ``send`` runs; ``errors`` maps
    each key that must end with an error result to a piece of its reason; ``kept`` maps keys that
    must keep the reward they had; ``dead`` lists the dead-letter kinds the case adds, and
    ``maybe`` kinds it may add too (when a worker reads its entries in one batch or in two).
    """

    name: str
    send: Callable[[Any, Any, Keyspace], object]
    errors: dict[str, str] = field(default_factory=dict)
    kept: dict[str, float] = field(default_factory=dict)
    dead: list[str] = field(default_factory=list)
    before: Callable[[Any], list[str]] | None = None
    maybe: list[str] = field(default_factory=list)


def _api(uid: str, sid: str, outputs: list[dict[str, Any]]) -> Callable[[Any], list[str]]:
    return lambda client: client.put_trajectory(uid, sid, outputs, SAMPLE)


BIG = 10**12
DEEP = b"\x91" * 5000 + b"\x01"  # 5000 nested one-element lists: past msgpack's nesting limit


def invalid(name: str, key: str, data: bytes | Callable[[], bytes] | None, reason: str) -> Case:
    """A raw entry for ``key`` that workers must dead-letter as invalid, answering ``key`` with an
    error naming ``reason``; ``data`` may be a function (called when the case is sent)."""
    return Case(
        name,
        lambda r, c, ks: xadd(r, ks, key, data() if callable(data) else data),
        errors={key: reason},
        dead=["invalid"],
    )


def cases(
    p: str = "h", *, big_payload: int = 2 * 1024 * 1024, reward: Callable[[list[int]], float] = lambda ids: len(ids)
) -> list[Case]:
    """Every hostile case, with trajectory ids prefixed by ``p`` (so runs do not collide).

    ``big_payload`` is the size of the oversize record (the worker under test must run with a
    smaller ``max_record_bytes``); ``reward`` is what the worker's manager gives a one-output
    trajectory with these response ids (default: their count, as ``LengthManager``).
    """
    k = f"{p}big_s_{BIG}"
    good = float(reward(GOOD["response_ids"]))
    return [
        invalid("huge index, raw", k, lambda: raw_record(f"{p}big", "s", BIG), f"index: {BIG} is too large"),
        Case(
            "huge index after a stored output",
            lambda r, c, ks: (
                c.put_output(f"{p}bigb", "s", 0, GOOD, SAMPLE),
                xadd(r, ks, f"{p}bigb_s_{BIG}", raw_record(f"{p}bigb", "s", BIG)),
            ),
            errors={f"{p}bigb_s_0": "is too large", f"{p}bigb_s_{BIG}": "is too large"},
            dead=["invalid"],
            maybe=["conflict"],  # output 0 stored after the trajectory failed: it arrived late
        ),
        invalid(
            "index just past max_outputs, raw",
            f"{p}edge_s_{MAX_OUTPUTS}",
            lambda: raw_record(f"{p}edge", "s", MAX_OUTPUTS),
            "is too large",
        ),
        invalid("index -1, raw", f"{p}neg_s_0", lambda: raw_record(f"{p}neg", "s", -1), "index: must be >= 0"),
        invalid("not msgpack (the redis-cli example)", f"{p}garb_s_0", b"hello", "not a valid msgpack record"),
        invalid("a msgpack list", f"{p}list_s_0", lambda: msgpack.packb([1, 2, 3]), "expected a msgpack map"),
        invalid("no data field", f"{p}nodata_s_0", None, "has no binary 'data' field"),
        invalid(
            "oversize payload",
            f"{p}huge_s_0",
            lambda: raw_record(f"{p}huge", "s", 0, pad="x" * big_payload),
            "exceeds max_record_bytes",
        ),
        invalid("deep nesting", f"{p}deep_s_0", DEEP, "not a valid msgpack record"),
        invalid(
            "NaN log-probabilities, raw",
            f"{p}nanlp_s_0",
            lambda: raw_record(f"{p}nanlp", "s", 0, response_logprobs=msgpack.ExtType(3, b"\x00\x00\xc0\x7f" * 2)),
            "response_logprobs: entry 0 is nan",
        ),
        invalid(
            "infinite reward_score, raw",
            f"{p}inf_s_0",
            lambda: raw_record(f"{p}inf", "s", 0, reward_score=float("inf")),
            "reward_score: is inf",
        ),
        invalid(
            "int key nested in the sample, raw",
            f"{p}intkey_s_0",
            lambda: raw_record(f"{p}intkey", "s", 0, sample={"reward_model": {1: "x"}}),
            "int is not allowed for map key",
        ),
        invalid(
            "unknown schema version",
            f"{p}ver_s_0",
            lambda: raw_record(f"{p}ver", "s", 0, v=99),
            "unknown schema version 99",
        ),
        invalid(
            "token ids as a plain list",
            f"{p}ids_s_0",
            lambda: raw_record(f"{p}ids", "s", 0, prompt_ids=[1, 2]),
            "prompt_ids: must be a packed integer array",
        ),
        Case(
            "entry key does not match the record",
            lambda r, c, ks: xadd(r, ks, f"{p}other_s_0", raw_record(f"{p}mism", "s", 0)),
            # the key the entry names (its producer waits on it), never the one the record claims
            errors={f"{p}other_s_0": "does not match the record"},
            dead=["invalid"],
        ),
        Case(
            "ambiguous key: session id with '_', raw, after the key's owner was scored",
            lambda r, c, ks: xadd(r, ks, f"{p}job_1_a_0", raw_record(f"{p}job", "1_a", 0, response_ids=OTHER_IDS)),
            before=_api(f"{p}job_1", "a", [GOOD]),
            kept={f"{p}job_1_a_0": good},
            dead=["invalid"],
        ),
        Case(
            "a different record for a finished key",
            lambda r, c, ks: c.put_output(f"{p}fin", "s", 0, OTHER, SAMPLE, final=True),
            before=_api(f"{p}fin", "s", [GOOD]),
            kept={f"{p}fin_s_0": good},
            dead=["conflict"],
        ),
        Case(
            "the same record again for a finished key (a redelivery: no dead letter)",
            lambda r, c, ks: c.put_output(f"{p}same", "s", 0, GOOD, SAMPLE, final=True),
            before=_api(f"{p}same", "s", [GOOD]),
            kept={f"{p}same_s_0": good},
        ),
        Case(
            "an output after its trajectory finished",
            lambda r, c, ks: c.put_output(f"{p}late", "s", 1, OTHER, SAMPLE, final=True),
            before=_api(f"{p}late", "s", [GOOD]),
            errors={f"{p}late_s_1": "arrived after its trajectory finished"},
            kept={f"{p}late_s_0": good},
            dead=["conflict"],
        ),
        Case(
            "two different records for one key while collecting",
            lambda r, c, ks: (
                c.put_output(f"{p}dup", "s", 0, GOOD, SAMPLE),
                c.put_output(f"{p}dup", "s", 0, OTHER, SAMPLE),
            ),
            errors={f"{p}dup_s_0": "two different records for key"},
            dead=["conflict"],
        ),
        Case(
            "two outputs marked final",
            lambda r, c, ks: (
                c.put_output(f"{p}fin2", "s", 0, GOOD, SAMPLE, final=True),
                c.put_output(f"{p}fin2", "s", 1, GOOD, SAMPLE, final=True),
            ),
            errors={f"{p}fin2_s_0": "two outputs marked final", f"{p}fin2_s_1": "two outputs marked final"},
            dead=["conflict"],
        ),
        Case(
            "5 MiB key field with garbage data (no key to answer for)",
            lambda r, c, ks: xadd(r, ks, b"k" * (5 * 1024 * 1024), b"junk"),
            dead=["invalid"],
        ),
    ]


OTHER_IDS = msgpack.ExtType(1, b"\x07\x00\x00\x00")
