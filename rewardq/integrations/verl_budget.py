"""The failure budget of one verl adapter or hook process: stop a run that trains on errors.

With ``verl_on_error=zero`` an error scores 0.0 and the run goes on, which is right for a scattered
failure (one judge timeout) and wrong for a broken fleet (a wrong tokenizer, an unknown data
source, a judge that is down): every reward would be a zero nobody computed. :class:`ErrorBudget`
keeps the outcome of the last ``window`` trajectories this process scored; once the window has
filled, a share of errors above ``max_rate`` raises :class:`~rewardq.errors.ScoringError`, whose
message counts the errors by reason. It never raises before the window has filled, so a run's
first few trajectories cannot stop it by chance.
"""

from __future__ import annotations

import re
from collections import Counter, deque

from rewardq.errors import ScoringError

#: How much of the last error message a ScoringError quotes.
LAST_ERROR_CHARS = 500
_SCORING_FAILED = re.compile(r"scoring failed: ([A-Za-z_][\w.]*)")


def error_reason(message: str) -> str:
    """A short, countable reason for an error message (``"timed out"``, ``"scoring failed (KeyError)"``)."""
    text = message.removeprefix("rewardq: ")
    if "wrong tokenizer" in text:
        return "wrong tokenizer"
    if text.startswith("the trajectory timed out"):
        return "timed out"
    if text.startswith("the trajectory could not be sent"):
        return "could not be sent"
    found = _SCORING_FAILED.search(text)
    if found:
        return f"scoring failed ({found.group(1)})"
    head = text.split(":", 1)[0].strip()
    return head[:60] or "error"


class ErrorBudget:
    """Outcomes of the last ``window`` trajectories; :meth:`record` raises once too many failed.

    Args:
        max_rate: largest share of errors the window may hold (``1`` never raises).
        window: how many trajectories the share is taken over.
        settings_hint: named in the error: which settings set the two numbers.
    """

    def __init__(self, max_rate: float, window: int, settings_hint: str = "") -> None:
        self.max_rate = max_rate
        self.window = window
        self.settings_hint = settings_hint
        self._outcomes: deque[str | None] = deque(maxlen=window)
        self._last_error = ""

    @property
    def errors(self) -> int:
        return sum(o is not None for o in self._outcomes)

    def record(self, error: str | None) -> None:
        """Count one trajectory (``error``: its error message, None when it was scored).

        Raises:
            ScoringError: the window is full and more than ``max_rate`` of it failed.
        """
        self._outcomes.append(None if error is None else error_reason(error))
        if error is not None:
            self._last_error = error
        if len(self._outcomes) < self.window or self.errors <= self.max_rate * self.window:
            return
        counts = Counter(o for o in self._outcomes if o is not None)
        by_reason = ", ".join(f"{n} {reason}" for reason, n in counts.most_common())
        hint = f" ({self.settings_hint})" if self.settings_hint else ""
        raise ScoringError(
            f"rewardq: {self.errors} of the last {self.window} trajectories scored by this process failed, "
            f"more than verl_max_error_rate={self.max_rate:g} allows{hint}: {by_reason}. Training on them would "
            "train on rewards nobody computed. Fix the cause (`rewardq status`, `rewardq dead-letters list`), "
            f"or raise the limit. The last error: {self._last_error[:LAST_ERROR_CHARS]}"
        )
