"""A failure's ledger rows are settled key by key by what the fail script wrote
(:mod:`rewardq.consumers.failure_rows`)."""

from __future__ import annotations

from rewardq.consumers.failure_rows import FailureRows
from rewardq.queue.codec import OutputRecord
from rewardq.queue.endings import Failed


class Book:
    """Records what a :class:`FailureRows` spools and settles, as a ledger would take it."""

    def __init__(self) -> None:
        self.spooled: list[tuple[int, list[tuple[int, bool]], int]] = []  # ticket, (index, final), attempt
        self.settled: list[tuple[int | None, bool | None]] = []

    def spool(self, records: list[OutputRecord], attempt: int) -> int:
        ticket = len(self.spooled) + 1
        self.spooled.append((ticket, [(r.index, r.final) for r in records], attempt))
        return ticket

    def settle(self, ticket: int | None, committed: bool | None) -> None:
        self.settled.append((ticket, committed))


def rows(book: Book, indexes: list[int], *, attempt: int = 0, final: int = -1) -> FailureRows:
    return FailureRows("u", "s", indexes, attempt, final, book.spool, book.settle).spool()


def test_rows_the_script_wrote_as_spooled_are_settled_committed() -> None:
    book = Book()
    rows(book, [0, 1, 2], attempt=3, final=2).settle(Failed([0, 1, 2], 3, 2))
    assert book.spooled == [(1, [(0, False), (1, False), (2, True)], 3)]
    assert book.settled == [(1, True)]


def test_keys_the_script_wrote_beyond_those_spooled_are_spooled_again_as_written() -> None:
    # a refused output 1, while Redis knew outputs up to the final 3 (another worker stored them)
    book = Book()
    rows(book, [0, 1], final=1).settle(Failed([0, 1, 2, 3], 0, 3))
    assert book.spooled[1] == (2, [(0, False), (1, False), (2, False), (3, True)], 0)
    assert book.settled == [(1, False), (2, True)]


def test_keys_that_kept_their_result_outrank_the_rows_spooled_for_them() -> None:
    # an exhausted entry past a finished trajectory: the script wrote its own key 4 alone
    book = Book()
    rows(book, [0, 1, 2, 3, 4], attempt=6, final=4).settle(Failed([4], 6, 3))
    assert book.spooled[1] == (2, [(4, False)], 6)
    assert book.settled == [(1, False), (2, True)]


def test_a_higher_attempt_from_the_trajectorys_hash_respools_the_rows_with_it() -> None:
    book = Book()
    rows(book, [0, 1], attempt=0, final=1).settle(Failed([0, 1], 2, 1))
    assert book.spooled[1] == (2, [(0, False), (1, True)], 2)
    assert book.settled == [(1, False), (2, True)]


def test_nothing_written_settles_false_and_a_script_that_did_not_end_leaves_it_unknown() -> None:
    book = Book()
    rows(book, [0], final=0).settle(Failed([], 0, -1))
    rows(book, [0], final=0).settle(None)
    assert [t for t, _, _ in book.spooled] == [1, 2]
    assert book.settled == [(1, False), (2, None)]


def test_rows_not_spooled_before_get_the_keys_the_script_wrote() -> None:
    book = Book()
    late = rows(book, [])
    assert book.spooled == [] and late.ticket is None
    late.settle(Failed([7], 1, 6))
    assert book.spooled == [(1, [(7, False)], 1)]
    assert book.settled == [(None, False), (1, True)]
