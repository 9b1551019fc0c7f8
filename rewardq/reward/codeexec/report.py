"""What crosses back from the local sandbox, read by a parser the program cannot break.

The harness's stdout holds three kinds of lines (see :mod:`.harness`):

* ``R <record>``: written by the runner after the run's token, which the supervisor checks and
  strips (a line without it never gets here: the supervisor counts it in the status's
  ``forged``); still read as untrusted (the runner shares its process with the program);
* ``S <status>`` and ``E <setup error>``: the supervisor's, which the program cannot reach.

Every ``R`` line goes through :func:`parse_record`, bounded in size, encoding and depth: at
most :data:`MAX_RECORD_BYTES`, ASCII only (the runner writes ``json.dumps`` output), one flat
JSON object (no ``[`` and one ``{`` outside strings, checked before any JSON parser sees it),
only the known keys with their types. Anything else is :class:`MalformedRecord`, and a run
with one is **the program's failure** (``malformed_report``, each of the run's cases ``-1``,
as verl scores a program that dies), never a sandbox or scoring error. ``S`` and ``E`` lines
that do not parse are a broken sandbox (:class:`~rewardq.errors.CodeSandboxError`).

Text that may end up in a result (``code_error``) goes through :func:`clean_text`: valid
UTF-8 (lone surrogates replaced), bounded length.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from rewardq.errors import CodeSandboxError
from rewardq.queue.states import FailureKind

#: Local runner: bytes one run may report (its printed output, JSON-escaped), counted where it
#: is printed; a case past it fails (``output_limit``).
CODE_MAX_OUTPUT_BYTES = 8 * 1024 * 1024


#: A record line longer than this is malformed (the runner's own lines stay below the output limit).
MAX_RECORD_BYTES = CODE_MAX_OUTPUT_BYTES + 4096
#: Characters of program-written text (an exception's message) kept in a result.
MAX_TEXT_CHARS = 500
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string literal (unrolled: linear time)
_SURROGATE = re.compile("[\ud800-\udfff]")
_TEXT_KEYS = ("out", "value", "error", "abort", "load_error", "failed", "exited", "tripwire", "detail")
_FLAG_KEYS = ("done", "loaded", "overflow")
_COUNT_KEYS = ("ran", "asserts")  # assert_case runs: assertions that ran, and in the test text
_BOOL_KEYS = ("held",)


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value < 1 << 31


#: Every field a runner writes: how its value must look, and the name of that look.
_CHECKS: dict[str, tuple[Any, str]] = {
    "case": (lambda v: type(v) is int and -1 <= v < 1 << 31, "a case number"),
    **{k: (lambda v: isinstance(v, str), "text") for k in _TEXT_KEYS},
    **{k: (lambda v: v is True, "true") for k in _FLAG_KEYS},
    **{k: (_count, "a count") for k in _COUNT_KEYS},
    **{k: (lambda v: type(v) is bool, "a boolean") for k in _BOOL_KEYS},
}


class MalformedRecord(ValueError):
    """A record line that is not one the runner writes (the program wrote on the pipe)."""


def clean_text(value: object, limit: int = MAX_TEXT_CHARS) -> str:
    """``value`` as text fit for a result: valid UTF-8 (lone surrogates and undecodable bytes
    become U+FFFD), no NUL, at most ``limit`` characters (an ellipsis marks a cut)."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", "replace")
    else:
        text = value if isinstance(value, str) else repr(value)
        text = _SURROGATE.sub("\ufffd", text)
    text = text.replace("\x00", "\ufffd")
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def parse_record(line: bytes) -> dict[str, Any]:
    """One ``R`` line's payload as a record dict.

    Raises:
        MalformedRecord: anything but a record the runner writes (see the module docstring).
    """
    if len(line) > MAX_RECORD_BYTES:
        raise MalformedRecord(f"a record of {len(line)} bytes")
    if not line.isascii():
        raise MalformedRecord("a record that is not ASCII JSON")
    skeleton = _STRING.sub(b'""', line)
    if skeleton.count(b"{") != 1 or b"[" in skeleton or not skeleton.startswith(b"{"):
        raise MalformedRecord("a record that is not one flat JSON object")
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise MalformedRecord(f"a record that is not JSON ({type(exc).__name__})") from None
    if not isinstance(record, dict) or not record:
        raise MalformedRecord("a record that is not a JSON object")
    for key, value in record.items():
        check = _CHECKS.get(key)
        if check is None:
            raise MalformedRecord(f"a record with an unknown field {clean_text(key, 40)!r}")
        if not check[0](value):
            raise MalformedRecord(f"a record whose {key} is not {check[1]}")
    return record


@dataclass
class RunReport:
    """What one run reported: the runner's records in order, and how its process ended.

    Attributes:
        malformed: why a record line of this run was malformed (the first one), else None.
        seconds: wall time of the run; ``job_seconds`` its job time (see ``harness_cgroup``).
        confined: what confined the runner (``"seccomp"``, ``"seccomp, landlock 7"``).
        forged: lines the supervisor dropped because they lacked the run's token (the program
            wrote on its report pipe).
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    exit: int | None = None
    signal: str | None = None
    timed_out: bool = False
    overflow: bool = False
    malformed: str | None = None
    seconds: float = 0.0
    job_seconds: float = 0.0
    confined: str | None = None
    forged: int = 0


def _status(payload: bytes) -> dict[str, Any]:
    try:
        st = json.loads(payload)
    except (ValueError, RecursionError):
        st = None
    if not isinstance(st, dict):
        raise CodeSandboxError(f"the local code sandbox wrote an unreadable status: {clean_text(payload, 200)!r}")
    return st


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def parse_report(out: bytes, err: bytes, code: int, n_runs: int) -> list[RunReport]:
    """The harness's stdout as one :class:`RunReport` per run.

    Raises:
        CodeSandboxError: a setup error, a runner that could not isolate itself (the supervisor
            says so, on a pipe the program never holds), a status line that does not parse, or
            fewer run reports than runs (the harness died); the message carries its stderr's tail.
    """
    reports: list[RunReport] = []
    current = RunReport()
    for line in out.split(b"\n"):
        kind, _, payload = line.partition(b" ")
        if kind == b"R":
            try:
                current.records.append(parse_record(payload))
            except MalformedRecord as exc:
                current.malformed = current.malformed or str(exc)
        elif kind == b"S":
            st = _status(payload)
            if st.get("sandbox_error"):
                why = clean_text(st["sandbox_error"], 800)
                raise CodeSandboxError(f"the local code sandbox could not isolate a program: {why}")
            current.exit = st.get("exit") if type(st.get("exit")) is int else None
            current.signal = clean_text(st["signal"], 20) if isinstance(st.get("signal"), str) else None
            current.timed_out, current.overflow = st.get("timed_out") is True, st.get("overflow") is True
            current.seconds, current.job_seconds = _number(st.get("seconds")), _number(st.get("job_seconds"))
            current.confined = clean_text(st["confined"], 100) if isinstance(st.get("confined"), str) else None
            current.forged = st["forged"] if type(st.get("forged")) is int else 0
            if current.forged and not current.malformed:
                current.malformed = f"{current.forged} line(s) without the run's token"
            reports.append(current)
            current = RunReport()
        elif kind == b"E":
            why = clean_text(_status(payload).get("setup_error", payload), 800)
            raise CodeSandboxError(f"the local code sandbox could not be set up: {why}")
    if len(reports) != n_runs:
        tail = clean_text(err.strip()[-800:], 800)
        raise CodeSandboxError(  # its supervisor died (killed under memory pressure, say): worth another try
            f"the local code sandbox ended (exit code {code}) after {len(reports)} of {n_runs} runs"
            + (f": {tail}" if tail else ""),
            failure_kind=FailureKind.TRANSIENT,
        )
    return reports
