"""What a worker reads from a stream, and what filing it in its trajectory answers.

:class:`Entry` is one stream entry as a worker read or reclaimed it; :func:`entries_from_reply`
turns an ``XREADGROUP`` reply into entries. :class:`StoreOutcome` is the answer of the
``store`` script (``lua/store.lua``) for one record, or of the ``claim`` fast path
(``lua/claim.lua``) for a whole trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rewardq.queue.codec import OutputRecord
from rewardq.queue.keys import MAX_KEY_BYTES, Keyspace
from rewardq.queue.results import as_text


@dataclass
class Entry:
    """One stream entry as read by a worker."""

    shard: int
    id: str
    fields: dict[bytes, bytes]
    deliveries: int = 1

    @property
    def data(self) -> Any:
        return self.fields.get(b"data")

    @property
    def blob_error(self) -> str | None:
        """Why the record's blob could not be read (:func:`rewardq.queue.blobs.resolve_entries`), if so."""
        why = self.fields.get(b"blob_error")
        return None if why is None else as_text(why)

    @property
    def key(self) -> str:
        """The entry's ``key`` field as text, cut to :data:`~rewardq.queue.keys.MAX_KEY_BYTES` + 1
        bytes (a longer one is never a valid key, and must not be copied around whole). Limits on
        keys count bytes, as Redis does, so a valid key is never cut; a cut one stays too long
        to be taken for a valid key."""
        raw = self.fields.get(b"key", b"")
        if isinstance(raw, (bytes, bytearray)):
            return as_text(raw[: MAX_KEY_BYTES + 1])
        return as_text(raw)[: MAX_KEY_BYTES + 1]

    @property
    def ts(self) -> float:
        try:
            return float(self.fields.get(b"ts", b"0"))
        except ValueError:
            return 0.0


def entries_from_reply(resp: Any, ks: Keyspace) -> list[Entry]:
    """The entries of an ``XREADGROUP`` reply (RESP2 list or RESP3 dict), each with its shard.

    Entries deleted while pending come back without fields and are left out.
    """
    out: list[Entry] = []
    if not resp:
        return out
    items = resp.items() if isinstance(resp, dict) else resp
    shard_of = {s.encode(): i for i, s in enumerate(ks.streams)}
    for name, entries in items:
        if (
            isinstance(entries, list)
            and entries
            and isinstance(entries[0], list)
            and len(entries) == 1
            and isinstance(entries[0][0], (list, tuple))
        ):
            entries = entries[0]
        shard = shard_of[name if isinstance(name, bytes) else name.encode()]
        for eid, fields in entries:
            if fields is None:  # deleted while pending
                continue
            out.append(Entry(shard, as_text(eid), fields))
    return out


@dataclass
class StoreOutcome:
    """What :meth:`~rewardq.queue.broker.StreamBroker.store` said about one record (see ``lua/store.lua``)."""

    kind: str  # parked | complete | leased | done | conflict
    entry: Entry
    record: OutputRecord
    payloads: list[bytes] = field(default_factory=list)
    detail: str = ""
    #: a conflict about a trajectory already finished: "kept" when the record's key has a result
    #: (which stays), "open" when it has none (the failure gives it one); "" for any other outcome
    late: str = ""
    #: the decoded outputs in index order, when the worker already holds them all (fast path)
    records: list[OutputRecord] | None = None
    #: scoring attempts of the trajectory, this one included (``complete`` only); above 1 an
    #: earlier lease ended without a commit (its worker died, or lost the lease)
    attempts: int = 1
    #: earlier starts of scoring it alone (``complete`` with ``attempts > 1`` only; see
    #: :meth:`~rewardq.queue.attempts.AttemptNotes.start_solo`)
    solo: int = 0
    #: earlier starts in a scorer of a reclaimed attempt, beside others (``complete`` with
    #: ``attempts > 1`` only; see :meth:`~rewardq.queue.attempts.AttemptNotes.start_shared`)
    shared: int = 0
