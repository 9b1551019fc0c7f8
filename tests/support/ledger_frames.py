"""Spool segments with wrong frames, for the ledger's tests: written by the worker's own spool, with
frames made by hand beside the worker's (a trajectory frame with a field changed, an outcome of
nothing, ...)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rewardq.ledger.frames import TrajectoryFacts, trajectory_parts
from rewardq.ledger.spool import Spool
from tests.support.ledger_facts import facts, read_facts

BLOB = {"scoring": "f" * 16, "scorer": "default:gsm8k", "manager": "naive"}
#: A frame made from the ticket the spool gives it.
Made = Callable[[int], bytes]


#: A value packed as an array nested deeper than JSON's encoder recurses (msgpack reads up to 1,024
#: levels, but packs no more than 511: put in place of :data:`DEEP` once packed).
DEEP, _DEEP_BYTES = "<deep>", b"\x91" * 1000 + b"\x01"


def _packed(value: object) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data.replace(msgpack.packb(DEEP), _DEEP_BYTES)


def framed(head: dict[str, Any], body: bytes = b"") -> bytes:
    data = _packed(head)
    return struct.pack("<I", len(data)) + data + body


def wrong(
    change: Callable[[dict[str, Any]], object] | None = None,
    record: Callable[[dict[str, Any]], object] | None = None,
    *,
    decoded: bool = False,
    uid: str = "bad",
) -> Made:
    """Trajectory ``uid`` as the worker spools it (as the records it read; ``decoded``: as a failure
    is spooled), then ``record`` applied to its last record's map and ``change`` to the frame's."""

    def make(ticket: int) -> bytes:
        t = facts(uid) if decoded else read_facts(uid)
        parts = trajectory_parts(ticket, t)
        head = msgpack.unpackb(bytes(parts[0])[4:], raw=False)
        body = [bytes(p) for p in parts[1:]]
        if record is not None:
            last = msgpack.unpackb(body[-1], raw=False)
            record(last)
            body[-1] = _packed(last)
            head["rec"] = [len(b) for b in body]
            head["raw"] = sum(head["rec"])
        if change is not None:
            change(head)
        return framed(head, b"".join(body))

    return make


def set_field(name: str, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda d: d.__setitem__(name, value)


def drop_field(name: str) -> Callable[[dict[str, Any]], object]:
    return lambda d: d.pop(name)


def spooled(folder: Path, items: list[TrajectoryFacts | Made]) -> Path:
    """A sealed segment written by the worker's own spool: each trajectory with its provenance blob and
    its commit outcome, and each hand-made frame as it is (numbered with the ticket it takes)."""
    spool = Spool(folder, "w", segment_bytes=1 << 30, segment_seconds=1e9, settle_seconds=0.0)
    spool.open()
    for item in items:
        ticket = spool.ticket()
        if isinstance(item, TrajectoryFacts):
            spool.append(ticket, trajectory_parts(ticket, item), (item.provenance, BLOB))
            spool.settle(ticket, True)
        else:
            spool.append(ticket, item(ticket))
    spool.seal()
    [path] = spool.ready(all_=True)
    spool.close()
    return path


def as_is(t: TrajectoryFacts) -> Made:
    """Trajectory ``t``'s frame alone: no provenance frame before it."""
    return lambda ticket: b"".join(bytes(p) for p in trajectory_parts(ticket, t))


def good() -> list[TrajectoryFacts]:
    """Trajectory ``a`` spooled as the records the worker read, ``b`` as a failure is (decoded)."""
    b = facts("b", 3, score=0.5)
    b.records[1].response_mask = np.array([1, 0, 1, 1, 0], dtype=np.uint8)
    return [read_facts("a"), b]


def ledger_rows(root: Path) -> pa.Table:
    tables = [pq.read_table(p) for p in sorted(root.glob("date=*/hour=*/*.parquet"))]
    return pa.concat_tables(tables).sort_by("key") if tables else pa.table({})
