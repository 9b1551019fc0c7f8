"""Counters of code execution per data source, for ``rewardq status`` and ``/metrics``.

One :class:`CodeStats` per manager context (so per worker). The worker publishes
:meth:`CodeStats.snapshot` in its heartbeat (``rewardq status`` sums it over live workers)
and exposes the same numbers as Prometheus counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rewardq.reward.codeexec.result import CodeResult


@dataclass
class SourceStats:
    """What one data source cost so far.

    Attributes:
        backend: ``local`` or ``sandbox_fusion`` (the last one used).
        trajectories: responses scored (or failed to score).
        runs: programs executed (local processes, or run_code requests).
        seconds: wall time spent scoring them.
        statuses: trajectories by ``code_status``; ``error`` counts those that raised
            (sandbox unreachable or broken: an error result, no reward).
        tripwires: responses that tripped a wire (a reward hack caught), by tripwire name.
    """

    backend: str
    trajectories: int = 0
    runs: int = 0
    seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    tripwires: dict[str, int] = field(default_factory=dict)


class CodeStats:
    """Per-data-source counters; updated by the code scorers, read by the worker."""

    def __init__(self) -> None:
        self.sources: dict[str, SourceStats] = {}

    def _source(self, data_source: str, backend: str) -> SourceStats:
        st = self.sources.get(data_source)
        if st is None:
            st = self.sources[data_source] = SourceStats(backend)
        st.backend = backend
        return st

    def record(self, data_source: str, backend: str, seconds: float, result: CodeResult | None) -> None:
        """Count one scored response (``result``) or one that raised (``None``)."""
        st = self._source(data_source, backend)
        st.trajectories += 1
        st.seconds += seconds
        status = "error" if result is None else result.status
        st.statuses[status] = st.statuses.get(status, 0) + 1
        if result is not None:
            st.runs += result.runs
            if result.tripwire:
                st.tripwires[result.tripwire] = st.tripwires.get(result.tripwire, 0) + 1

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """``{data_source: {backend, trajectories, runs, seconds, statuses, tripwires}}`` (JSON-able)."""
        return {
            ds: {
                "backend": st.backend,
                "trajectories": st.trajectories,
                "runs": st.runs,
                "seconds": round(st.seconds, 6),
                "statuses": dict(st.statuses),
                "tripwires": dict(st.tripwires),
            }
            for ds, st in sorted(self.sources.items())
        }
