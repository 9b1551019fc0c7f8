"""When a busy scorer process counts as stuck, so that a spare process starts for the calls waiting.

A spare exists to protect calls that wait behind hung ones. Starting one costs a process and
its imports (sympy and math-verify take seconds of CPU), so it must start only for a call that
waits, and only behind a process that is really stuck. Wall time alone cannot tell: on a loaded
machine an ordinary call waits longer for a core than a fixed limit, and spares started for such
calls load the machine further (a storm). So a busy process counts as stuck
(:meth:`SparePolicy.slot_stuck`) once its call has run for its **threshold** and, from then on,
either

* uses less CPU than ``cpu_share`` of its wall time (it sleeps or waits on something: a hang), or
* uses CPU at a rate that, over the whole call, comes to more than the threshold itself (it spins);

a call that merely waits for a core keeps its process counted. The threshold is ``spare_after``
seconds, or ``share`` of the call's own budget when that is sooner, so a spare starts well before
the budget of a call behind it would be at risk, whatever ``score_timeout`` is. Where a process's
CPU time cannot be read (no ``/proc``), wall time alone decides.

The pool (:class:`~rewardq.reward.execution.process_pool.ScorerPool`) adds the bounds: at most ``most``
spares alive at once, one started only for a waiting call that no idle or starting process
will take, and a process beyond the pool's size exits only after ``idle`` seconds without work.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rewardq.reward.execution.settings import SCORER_SPARE_AFTER, SCORER_SPARE_IDLE, SCORER_SPARES

if TYPE_CHECKING:
    from rewardq.reward.execution.scorer_slot import ScorerSlot


#: Share of a call's budget (the trajectory's ``score_timeout``) after which its busy process may
#: count as stuck, when that comes before ``SCORER_SPARE_AFTER``.
SCORER_SPARE_SHARE = 0.25
#: A busy process past that point counts as stuck only when its call used less CPU than this
#: share of its wall time (it sleeps or waits: a hang), or CPU time beyond the same point (it
#: spins). A call that only waits for a core on a loaded machine keeps its process counted.
SCORER_STUCK_CPU_SHARE = 0.05

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: Seconds between the two looks at a call's CPU time (the kernel counts it in 10 ms ticks).
MIN_WINDOW = 0.1


def cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system) process ``pid`` has used, or None when it cannot be read."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # after "pid (comm) ": state is field 3
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime: fields 14 and 15
    except (IndexError, ValueError):
        return None


@dataclass
class SparePolicy:
    """The pool's spare rules (see the module docstring).

    Attributes:
        after: seconds a call may run before its process may count as stuck; None: never (no spares).
        most: spare processes alive at once at most, beyond the pool's size.
        idle: seconds a process beyond the pool's size stays idle before it exits.
        share: share of a call's budget after which its process may count as stuck, if sooner.
        cpu_share: below this share of CPU per wall second, a call past its threshold is a hang.
        cpu_of: reads a process's CPU seconds (:func:`cpu_seconds`; tests give their own).
    """

    after: float | None = SCORER_SPARE_AFTER
    most: int = SCORER_SPARES
    idle: float = SCORER_SPARE_IDLE
    share: float = SCORER_SPARE_SHARE
    cpu_share: float = SCORER_STUCK_CPU_SHARE
    cpu_of: Callable[[int | None], float | None] = field(default=cpu_seconds, repr=False)

    def __post_init__(self) -> None:
        self.most = max(0, int(self.most))

    @property
    def enabled(self) -> bool:
        return self.after is not None and self.most > 0

    def threshold(self, budget: float | None) -> float | None:
        """Seconds a call with ``budget`` seconds runs before its process may count as stuck."""
        if self.after is None:
            return None
        if budget is None or budget <= 0:
            return self.after
        return min(self.after, self.share * budget)

    # -- decisions over a pool's slots (the pool acts on them) --------------------------------
    def slot_stuck(self, slot: ScorerSlot, now: float) -> bool:
        """Whether ``slot`` is busy on a call that counts as stuck.

        A call past its threshold is looked at twice: the first look notes its process's CPU time
        (``slot.cpu_mark``; nothing is read before, so an ordinary call costs no ``/proc`` read),
        later looks, at least ``MIN_WINDOW`` seconds on, judge by the CPU it used in between.
        """
        if slot.busy_since is None or slot.threshold is None:
            return False
        ran = now - slot.busy_since
        if ran < slot.threshold:
            return False
        cpu = self.cpu_of(slot.pid)
        if cpu is None:
            return True  # no /proc: wall time alone
        if slot.cpu_mark is None:
            slot.cpu_mark = (ran, cpu)
            return False
        ran0, cpu0 = slot.cpu_mark
        if ran - ran0 >= MIN_WINDOW:
            rate = (cpu - cpu0) / (ran - ran0)
            slot.stuck_seen = rate < self.cpu_share or rate * ran >= slot.threshold
        return slot.stuck_seen

    def able(self, slots: Sequence[ScorerSlot], now: float) -> int:
        """How many of ``slots`` can take work: starting, idle, or busy on a call not stuck."""
        return sum(1 for s in slots if not s.dead and not self.slot_stuck(s, now))

    def check_in(self, slots: Sequence[ScorerSlot], now: float) -> float | None:
        """Seconds until a waiting call should look for stuck processes again (None: never)."""
        if not self.enabled:
            return None
        due = [
            s.busy_since + s.threshold - now
            for s in slots
            if s.busy_since is not None and s.threshold is not None and not s.dead
        ]
        ahead = [d for d in due if d > 0]
        if ahead:
            return max(0.02, min(ahead))
        # past their thresholds but not stuck (computing, or waiting for a core): look again soon
        return max(0.05, min(0.25, self.after or 0.25))

    def spare_due(self, slots: Sequence[ScorerSlot], waiting: int, size: int, now: float) -> bool:
        """Whether a spare should start: below ``size + most`` processes alive, a waiting call that
        no idle or starting process will take, and fewer than ``size`` processes able to take work."""
        if not self.enabled:
            return False
        live = [s for s in slots if not s.dead]
        if len(live) >= size + self.most:
            return False
        coming = sum(1 for s in live if s.busy_since is None)
        return coming < waiting and self.able(live, now) < size

    def to_retire(self, slots: Sequence[ScorerSlot], waiting: int, size: int, now: float) -> list[ScorerSlot]:
        """The processes beyond ``size`` idle for ``idle`` seconds, longest idle first (none while a call waits)."""
        if waiting:
            return []
        surplus = self.able(slots, now) - size
        idle = sorted((s for s in slots if s.ready and not s.dead and s.busy_since is None), key=lambda s: s.idle_since)
        return [s for s in idle if now - s.idle_since >= self.idle][: max(0, surplus)]

    def next_trim(self, slots: Sequence[ScorerSlot], size: int, now: float) -> float | None:
        """Seconds until an idle process beyond ``size`` is due to exit (None: none is beyond it)."""
        if self.able(slots, now) <= size:
            return None
        idle = [s.idle_since + self.idle - now for s in slots if s.ready and not s.dead and s.busy_since is None]
        return max(0.05, min(idle, default=self.idle))
