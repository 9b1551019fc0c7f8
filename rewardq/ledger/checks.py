"""What the flusher checks of a spooled frame before any of it goes into a table.

A frame can parse (valid msgpack, a kind this rewardq knows) and still be wrong: a field
missing, or of another type or shape than the worker writes (a hand-made frame, a bug, damage
that left valid msgpack). Such a frame must cost its segment nothing else: the rows of a whole
partition are made into one Arrow table at once, so one wrong value taken in would fail every
row beside it, and the segment with them, on every retry. So a frame is checked before any of
it is taken, and a wrong one raises :class:`WrongFrame` naming the field; the flusher counts it
as unreadable with that reason and writes the segment's other frames
(docs/ledger.md#unreadable-frames).

What is checked is what building the rows takes as it is: the values that go into typed
columns unconverted (indexes, flags, counts, times, numbers, text), and the shapes the rows
take apart (lists, maps, the id arrays' lengths). What the rows convert themselves needs no
check: result values become text or null whatever they are (:mod:`rewardq.ledger.results`), and
samples and extra fields become JSON (a value JSON cannot hold raises :class:`WrongFrame` there).
Each check is a type test, most of them once per trajectory: ~4 µs of the flusher's ~115 µs per
trajectory in one process, inside the noise of its benchmarks (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Mapping

#: The largest value of an ``int32`` column (``index``, ``num_turns``, ``attempt``).
INT32_MAX = 2**31 - 1
_NUMBER = (int, float)


class WrongFrame(Exception):
    """A spooled frame that parses but cannot become rows: which part of it, which field, what is wrong.

    Its text is the reason the flusher counts it under (no value of the frame in it, so one
    reason holds every frame wrong the same way)."""

    def __init__(self, part: str, name: str, problem: str) -> None:
        super().__init__(part, name, problem)
        self.part, self.name, self.problem = part, name, problem

    def __str__(self) -> str:
        return f"{self.part} field {self.name!r} {self.problem}"


def got(value: object) -> str:
    """``(missing)`` or ``(got <type>)``, what a reason says of a wrong value."""
    return "(missing)" if value is None else f"(got {type(value).__name__})"


def is_number(value: object) -> bool:
    """An int or a float (not a bool, which msgpack keeps apart)."""
    return type(value) in _NUMBER


def check_outcome(frame: Mapping[str, object]) -> tuple[int, bool | None]:
    """A commit outcome frame's ticket and ``committed``."""
    ticket, committed = frame.get("tk"), frame.get("c")
    if type(ticket) is not int:
        raise WrongFrame("commit outcome", "tk", f"is not a ticket number {got(ticket)}")
    if committed is not None and type(committed) is not bool:
        raise WrongFrame("commit outcome", "c", f"is not true, false or nil {got(committed)}")
    return ticket, committed


def check_provenance(frame: Mapping[str, object]) -> tuple[str, Mapping[str, object]]:
    """A provenance frame's digest and blob."""
    digest, blob = frame.get("d"), frame.get("b")
    if type(digest) is not str:
        raise WrongFrame("provenance", "d", f"is not a digest {got(digest)}")
    if type(blob) is not dict:
        raise WrongFrame("provenance", "b", f"is not a map {got(blob)}")
    return digest, blob


def check_trajectory(t: Mapping[str, object]) -> None:
    """The fields of a trajectory frame (its outputs given already) that rows take as they are.

    Required: ``tk``, ``u``, ``sid``, ``o``; the others may be missing or nil. The result rows
    (``rf``, ``r``) are checked where they are taken apart
    (:meth:`~rewardq.ledger.results.ResultColumns.split`), the outputs where the body is read.
    One expression passes a frame as the worker writes it (this is paid per trajectory); a frame
    it does not pass is looked at field by field, to say which is wrong."""
    get = t.get
    outputs, attempt, put_ts, score_ms, pv, text = get("o"), get("a"), get("ts"), get("sm"), get("pv"), get("txt")
    if (
        type(get("tk")) is int
        and type(get("u")) is str
        and type(get("sid")) is str
        and type(outputs) is list
        and outputs
        and (attempt is None or (type(attempt) is int and 0 <= attempt <= INT32_MAX))
        and (put_ts is None or type(put_ts) in _NUMBER)
        and (score_ms is None or type(score_ms) in _NUMBER)
        and (pv is None or type(pv) is str)
        and (text is None or type(text) is str)
        and not get("j")
    ):
        return
    _explain_trajectory(t)


def _explain_trajectory(t: Mapping[str, object]) -> None:
    """:func:`check_trajectory` field by field: raises WrongFrame naming the first wrong field."""
    if type(t.get("tk")) is not int:
        raise WrongFrame("trajectory", "tk", f"is not a ticket number {got(t.get('tk'))}")
    for name in ("u", "sid"):
        if type(t.get(name)) is not str:
            raise WrongFrame("trajectory", name, f"is not a string {got(t.get(name))}")
    outputs = t.get("o")
    if type(outputs) is not list or not outputs:
        raise WrongFrame("trajectory", "o", f"is not a list of outputs {got(outputs)}")
    attempt = t.get("a")
    if attempt is not None and (type(attempt) is not int or not 0 <= attempt <= INT32_MAX):
        raise WrongFrame("trajectory", "a", f"is not an attempt number {got(attempt)}")
    for name in ("ts", "sm"):
        value = t.get(name)
        if value is not None and type(value) not in _NUMBER:
            raise WrongFrame("trajectory", name, f"is not a number {got(value)}")
    for name in ("pv", "txt"):
        value = t.get(name)
        if value is not None and type(value) is not str:
            raise WrongFrame("trajectory", name, f"is not a string {got(value)}")
    judge = t.get("j")
    if judge:
        _check_judge(judge)


def _check_judge(judge: object) -> None:
    """``j``: ``[index, request digest, answer]`` per judge request (shorter entries are ignored)."""
    if type(judge) is not list:
        raise WrongFrame("trajectory", "j", f"is not a list of judge requests {got(judge)}")
    for entry in judge:
        if type(entry) is not list or (len(entry) >= 3 and type(entry[0]) is not int):
            raise WrongFrame("trajectory", "j", "holds a judge request that is not [index, digest, answer]")


def check_output(part: str, index: object, final: object, turns: object, score: object) -> None:
    """An output's values that go into typed columns as they are (``part``: where they come from,
    ``record`` or the frame's ``o``)."""
    if type(index) is not int or not 0 <= index <= INT32_MAX:
        raise WrongFrame(part, "index", f"is not an output index {got(index)}")
    if type(final) is not bool:
        raise WrongFrame(part, "final", f"is not true or false {got(final)}")
    if turns is not None and (type(turns) is not int or not 0 <= turns <= INT32_MAX):
        raise WrongFrame(part, "num_turns", f"is not a count {got(turns)}")
    if score is not None and type(score) not in _NUMBER:
        raise WrongFrame(part, "reward_score", f"is not a number {got(score)}")
