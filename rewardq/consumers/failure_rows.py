"""A failure's ledger rows, key by key as the fail script wrote them (docs/ledger.md).

A failure's rows are spooled *before* its fail script, so a worker killed after the script still
has them: for the keys the worker expects the script to answer, with the attempt it expects. The
script is what decides, atomically: which keys get an error result (a key that already has one,
another worker's or an earlier trajectory's, keeps it; a trajectory Redis knows further than this
worker does answers for more keys) and with which attempt (the worker's, or the scoring attempts
the trajectory's hash counted when more). :meth:`FailureRows.settle` then makes the ledger agree
with Redis key by key: when the script wrote exactly the rows spooled, they are settled
``committed = true``; otherwise they are settled ``committed = false`` (they outrank nothing) and
the keys the script wrote are spooled again as it wrote them, settled ``committed = true``. The
script's reply is the same when the call was sent again after its reply was lost (it keeps it:
:func:`~rewardq.queue.endings.call_nonce`), so a resend settles the rows as the first run wrote them.

A key the script wrote whose index is past int32 (only a hostile record names one) has no row: the
ledger's column cannot hold it. It is counted once, at :meth:`FailureRows.settle` (``unkept``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from rewardq.ledger.checks import INT32_MAX
from rewardq.ledger.frames import stub_record
from rewardq.queue.codec import OutputRecord
from rewardq.queue.endings import Failed

#: Spools rows (``records``, ``attempt``) and returns their ticket (None: not spooled).
SpoolRows = Callable[[list[OutputRecord], int], "int | None"]
#: Tells the ledger whether the rows of a ticket are what Redis holds (None: not known).
SettleRows = Callable[["int | None", "bool | None"], None]


@dataclass
class FailureRows:
    """The ledger rows of the keys one failure answers (see the module doc).

    Args:
        uid, session_id: the trajectory's names.
        indexes: the keys the worker expects the fail script to answer, in order.
        attempt: the attempt it expects their error results to say.
        final: the index whose row is its trajectory's final row (-1: none).
        spool_rows: spools rows; settle_rows: settles a ticket.
        known: the decoded records by index (their rows keep ids and sample; the others are
            identity only).
        unkept: told each key the script wrote that cannot have a row (an index past int32);
            ``spool_rows`` leaves such keys out.
    """

    uid: str
    session_id: str
    indexes: list[int]
    attempt: int
    final: int
    spool_rows: SpoolRows
    settle_rows: SettleRows
    known: Mapping[int, OutputRecord] = field(default_factory=dict)
    unkept: Callable[[int], None] = lambda _index: None
    ticket: int | None = None

    def spool(self) -> FailureRows:
        """Spool the expected rows (before the fail script); returns itself."""
        if self.indexes:
            self.ticket = self.spool_rows(self.rows(self.indexes, self.final), self.attempt)
        return self

    def settle(self, failed: Failed | None) -> None:
        """Settle the rows by what the fail script wrote (None: it did not run to its end, so the
        entries stay pending and ``committed`` stays unknown)."""
        if failed is None:
            self.settle_rows(self.ticket, None)
            return
        for i in failed.indexes:
            if i > INT32_MAX:
                self.unkept(i)
        final = failed.final if failed.final >= 0 else self.final
        if failed.final < 0 and failed.indexes and max(failed.indexes) > self.final:
            # Redis knew no final index and wrote keys past the one this worker took for final:
            # which key is final is not known, so no row says it is
            final = -1
        same = failed.indexes == self.indexes and failed.attempt == self.attempt
        if same and _final_in(failed.indexes, final) == _final_in(self.indexes, self.final):
            self.settle_rows(self.ticket, True)
            return
        # rows that say what Redis does not: they outrank nothing; the keys written, as written
        self.settle_rows(self.ticket, False)
        if failed.indexes:
            self.settle_rows(self.spool_rows(self.rows(failed.indexes, final), failed.attempt), True)

    def rows(self, indexes: Sequence[int], final: int) -> list[OutputRecord]:
        """The records of ``indexes``: the decoded ones, else each key's identity (``final``: the
        index whose row is its trajectory's final row)."""
        return [self._record(i, final) for i in indexes]

    def _record(self, i: int, final: int) -> OutputRecord:
        rec = self.known.get(i)
        if rec is None:
            return stub_record(self.uid, self.session_id, i, final=i == final)
        # the row says whether it is its trajectory's final row as Redis knows it, whatever the record said
        return rec if rec.final == (i == final) else replace(rec, final=i == final)


def _final_in(indexes: Sequence[int], final: int) -> int:
    """``final`` when it is one of ``indexes``, else -1."""
    return final if final in indexes else -1


def with_parked_records(
    known: Sequence[OutputRecord], parked: Mapping[int, bytes], decode: Callable[[bytes], OutputRecord], tid: str
) -> list[OutputRecord]:
    """``known`` and the ``parked`` records (raw, by index) of trajectory ``tid`` that ``decode``
    decodes into that trajectory's record of that index, in index order: a parked record that does
    not decode, or names another key, is left out (its row keeps the identity only)."""
    out = list(known)
    for i, data in parked.items():
        try:
            rec = decode(data)
        except Exception:  # noqa: BLE001 - a record that does not decode: its row keeps the identity only
            continue
        if rec.tid == tid and rec.index == i:
            out.append(rec)
    return sorted(out, key=_index)


def _index(rec: OutputRecord) -> int:
    return rec.index
