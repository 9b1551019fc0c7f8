"""Reading results back: a trajectory's shared result row, the per-key result hashes, the round
trips a read is cut into, the bookkeeping of one wait, and the ``done`` streams that announce
finished trajectories.

No I/O here; :mod:`rewardq.producers.client` and :mod:`rewardq.producers.aio` send the reads.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewardq.queue.keys import Keyspace, split_key
from rewardq.queue.results import RewardResult


def parse_results(keys: Sequence[str], hashes: Iterable[Mapping[Any, Any]]) -> dict[str, RewardResult | None]:
    return {k: (RewardResult.from_hash(k, h) if h else None) for k, h in zip(keys, hashes)}


def keys_by_trajectory(keys: Sequence[str]) -> dict[str, list[str]]:
    """``keys`` grouped by their trajectory id, in the order given."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        groups.setdefault(k.rpartition("_")[0], []).append(k)
    return groups


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def parse_trajectory(keys: Sequence[str], h: Mapping[Any, Any]) -> tuple[dict[str, RewardResult | None], list[str]]:
    """The results of ``keys`` (one trajectory's) from its trajectory hash ``h``, and the keys it
    cannot answer for, to be read from their own result hashes.

    The ``commit`` script copies a trajectory's results into its hash (``result_rows``,
    ``result:<row>:<field>``; see ``lua/commit.lua``) when they are small. A trajectory still
    collecting or scoring has no result yet (every result appears in the script that sets ``state``
    to ``done``); one done without the copy (results written by ``fail`` or ``expire``, or too
    large), or whose hash is gone, is answered by the result hashes.
    """
    rows = h.get(b"result_rows", h.get("result_rows"))
    if rows is None:
        if _text(h.get(b"state", h.get("state", b""))) == "collecting":
            return dict.fromkeys(keys), []
        return {}, list(keys)
    fields: dict[int, dict[str, str]] = {}
    for name, value in h.items():
        if isinstance(name, (bytes, bytearray)):  # the prefix is ASCII: tested before any decoding
            if not name.startswith(b"result:"):
                continue
            name = name.decode("utf-8", "replace")
        elif not str(name).startswith("result:"):
            continue
        _, number, field_name = str(name).split(":", 2)
        fields.setdefault(int(number), {})[field_name] = _text(value)
    count = int(rows)
    n = int(_text(h.get(b"n", h.get("n", b"0"))) or 0)
    out: dict[str, RewardResult | None] = {}
    missing = []
    parsed: dict[int, RewardResult] = {}  # each row parsed once; its keys get copies
    for k in keys:
        index = int(k.rpartition("_")[2])
        # the rows answer the trajectory's own n outputs only: a key past them (an output that
        # arrived after it finished) has its own result hash, an error the rows know nothing of
        row = (0 if count == 1 else index) if index < n else -1
        values = fields.get(row)
        if not values:
            missing.append(k)
        elif row in parsed:
            out[k] = parsed[row].for_key(k)
        else:
            out[k] = parsed[row] = RewardResult.from_text(k, values)
    return out, missing


class ReadPlan:
    """The keys of one read of results, in round trips that each bring back about ``budget`` bytes.

    One pipeline of HGETALLs is answered by Redis in one go, other clients waiting meanwhile: 300
    results of 900 KB read at once held every other client for ~0.4 s. So a read starts with
    :data:`FIRST` keys and sizes each next round trip from the results seen so far (up to
    :data:`MOST` keys): thousands of small results still come in a few round trips, large ones
    about ``budget`` bytes at a time.
    """

    FIRST = 16
    MOST = 1024
    BUDGET = 8 * 1024 * 1024

    def __init__(self, keys: Sequence[str], budget: int = BUDGET) -> None:
        self.keys = list(keys)
        self.budget = budget
        self.next = self.FIRST
        self.read = 0
        self.bytes = 0

    def __iter__(self) -> Iterator[list[str]]:
        start = 0
        while start < len(self.keys):
            chunk = self.keys[start : start + self.next]
            start += len(chunk)
            yield chunk

    def took(self, hashes: Sequence[Mapping[Any, Any]]) -> None:
        """Note what a round trip brought back, to size the next one."""
        self.read += len(hashes)
        self.bytes += sum(len(k) + len(v) for h in hashes if h for k, v in h.items())
        per_key = max(1, self.bytes // max(1, self.read))
        self.next = max(1, min(self.MOST, self.budget // per_key))


def check_keys(keys: Iterable[str]) -> list[str]:
    keys = [keys] if isinstance(keys, str) else list(keys)
    for k in keys:
        split_key(k)  # raises ValueError naming the bad key
    return keys


@dataclass
class Waiter:
    """Bookkeeping of one ``wait_rewards`` call."""

    keys: list[str]
    timeout: float
    deadline: float = 0.0
    results: dict[str, RewardResult] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout

    @property
    def missing(self) -> list[str]:
        return [k for k in self.keys if k not in self.results]

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def absorb(self, got: Mapping[str, RewardResult | None]) -> None:
        for k, r in got.items():
            if r is not None:
                self.results[k] = r

    def missing_for(self, tids: set[str]) -> list[str]:
        return [k for k in self.missing if k.rpartition("_")[0] in tids]

    def ordered(self) -> dict[str, RewardResult]:
        return {k: self.results[k] for k in self.keys}


def sweep_share(tids: Sequence[str], start: int, limit: int) -> tuple[list[str], int]:
    """The trajectories one sweep asks about: all of ``tids``, or ``limit`` of them from ``start``
    on (wrapping); and where the next sweep starts."""
    if len(tids) <= limit:
        return list(tids), 0
    start %= len(tids)
    return (list(tids[start:]) + list(tids[:start]))[:limit], start + limit


def ended(tids: Sequence[str], states: Sequence[bytes | None]) -> list[str]:
    """The trajectories among ``tids`` whose hash's ``state`` (``states``, in the same order) says
    they have ended."""
    return [t for t, state in zip(tids, states) if state == b"done"]


def finished_tids(ks: Keyspace, resp: Any, last: dict[int, bytes]) -> list[str]:
    """The trajectory ids in an XREAD reply over ``done`` streams; advances ``last`` (shard -> id)."""
    return [tid for tid, _ in finished(ks, resp, last)]


def finished(ks: Keyspace, resp: Any, last: dict[int, bytes]) -> list[tuple[str, Mapping[bytes, Any]]]:
    """The trajectories an XREAD reply over ``done`` streams announces, each with its entry's
    fields (which hold the trajectory's results when they are one small row: :func:`parse_trajectory`
    reads them as it reads the trajectory's hash); advances ``last`` (shard -> id)."""
    index = {ks.done(s).encode(): s for s in last}
    found = []
    items = resp.items() if isinstance(resp, dict) else (resp or [])
    for name, entries in items:
        if entries and isinstance(entries[0], list) and len(entries) == 1 and isinstance(entries[0][0], (list, tuple)):
            entries = entries[0]  # RESP3 map shape
        s = index[name if isinstance(name, bytes) else name.encode()]
        for eid, fields in entries:
            last[s] = eid
            tid = fields.get(b"tid")
            if tid is not None:
                found.append((tid.decode(), fields))
    return found
