"""What a manager's run on one trajectory noticed, for its provenance and the ledger.

The worker opens a :class:`ScoringTrace` around each ``run_single`` (:func:`tracing`); code the
manager calls notes into it without being handed anything: the base class's decoders note the
text they decoded (so the ledger keeps the decoded final response without decoding it twice),
and the LLM judge notes each request's digest and answer (so a result names the cached answer it
came from, and a replay can reuse it). A context variable carries it: each scoring task has its
own, and tasks the manager starts inherit it. Outside a trace, noting costs one lookup and does
nothing.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["ScoringTrace", "tracing", "note_decoded", "note_judged"]


@dataclass
class ScoringTrace:
    """What one ``run_single`` noted.

    Attributes:
        decoded: ``(token count, text)`` of each response decoded through the manager base class.
        judged: output index -> ``(request digest, answer JSON)`` of each judge request.
    """

    decoded: list[tuple[int, str]] = field(default_factory=list)
    judged: dict[int, tuple[str, str]] = field(default_factory=dict)

    def response_of(self, tokens: int) -> str | None:
        """The last decoded text of a response of ``tokens`` tokens (the final output's), if any."""
        for n, text in reversed(self.decoded):
            if n == tokens:
                return text
        return None


_CURRENT: contextvars.ContextVar[ScoringTrace | None] = contextvars.ContextVar("rewardq_scoring_trace", default=None)


@contextmanager
def tracing(trace: ScoringTrace | None) -> Iterator[ScoringTrace | None]:
    """Make ``trace`` the current one for the ``with`` block (None: no tracing)."""
    token = _CURRENT.set(trace)
    try:
        yield trace
    finally:
        _CURRENT.reset(token)


def note_decoded(tokens: int, text: str) -> None:
    """A response of ``tokens`` tokens was decoded to ``text``."""
    trace = _CURRENT.get()
    if trace is not None:
        trace.decoded.append((tokens, text))


def note_judged(index: int, digest: str, answer: str) -> None:
    """Output ``index`` was judged by the request ``digest``, which was answered ``answer`` (JSON)."""
    trace = _CURRENT.get()
    if trace is not None:
        trace.judged[index] = (digest, answer)
