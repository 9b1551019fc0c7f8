"""Prometheus metrics for ``rewardq worker --metrics-port P``.

The worker reports through four calls (``trajectory_done``, ``dead_letter``, ``reclaimed``,
``in_flight``); :class:`PrometheusMetrics` turns them into

* ``rewardq_trajectories_total{outcome}``           counter (ok, error, invalid, commit-failed, ...)
* ``rewardq_trajectory_seconds``                    histogram of scoring time per trajectory
* ``rewardq_dead_letters_total{kind}``              counter (invalid, conflict, exhausted, scoring, incomplete)
* ``rewardq_reclaimed_total``                       counter of entries taken over from dead workers
* ``rewardq_in_flight``                             gauge of trajectories being scored

served at ``http://<host>:P/metrics``. Each worker gets its own registry, so tests can run
several in one process; with ``--processes N`` child ``i`` listens on ``P + i``.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("rewardq.metrics")

__all__ = ["PrometheusMetrics", "start_metrics"]


class PrometheusMetrics:
    """The worker's metrics sink, backed by a private ``prometheus_client`` registry."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self._done = Counter("rewardq_trajectories_total", "Trajectories finished, by outcome", ["outcome"],
                             registry=self.registry)
        self._seconds = Histogram("rewardq_trajectory_seconds", "Scoring time per trajectory",
                                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
                                  registry=self.registry)
        self._dead = Counter("rewardq_dead_letters_total", "Dead-lettered entries and trajectories, by kind",
                             ["kind"], registry=self.registry)
        self._reclaimed = Counter("rewardq_reclaimed_total", "Entries reclaimed from idle consumers",
                                  registry=self.registry)
        self._in_flight = Gauge("rewardq_in_flight", "Trajectories being scored", registry=self.registry)

    def trajectory_done(self, outcome: str, seconds: float) -> None:
        self._done.labels(outcome).inc()
        self._seconds.observe(seconds)

    def dead_letter(self, kind: str) -> None:
        self._dead.labels(kind).inc()

    def reclaimed(self, n: int) -> None:
        self._reclaimed.inc(n)

    def in_flight(self, n: int) -> None:
        self._in_flight.set(n)


def start_metrics(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve a fresh :class:`PrometheusMetrics` on ``addr:port``; returns it."""
    from rewardq.errors import ConfigError

    try:
        from prometheus_client import start_http_server
    except ImportError:
        raise ConfigError("--metrics-port needs prometheus-client: pip install prometheus-client") from None
    metrics = PrometheusMetrics()
    try:
        start_http_server(port, addr=addr, registry=metrics.registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {addr}:{port} ({exc}); pick a free --metrics-port") from None
    logger.info("metrics at http://%s:%d/metrics", addr, port)
    return metrics
