"""Prometheus metrics of one worker (``rewardq worker --metrics-port P``).

Exposed series (all prefixed ``rewardq_``):

* ``records_read_total``                       entries read from the streams (incl. reclaimed)
* ``trajectories_total{manager,outcome}``      finished trajectories: ok | error | invalid | ...
* ``dead_letters_total{reason}``               dead letters by kind: every
                                               :class:`~rewardq.queue.states.DeadLetterKind`
* ``failures_total{data_source,kind}``         error results written by this worker, by the
                                               trajectory's data source and the failure kind
                                               (every :class:`~rewardq.queue.states.FailureKind`)
* ``retries_total{data_source}``               transient failures retried in place
* ``retry_waiting``                            trajectories waiting on a retry now
* ``redis_full_waits_total``                   writes of results Redis refused because it was past
                                               ``maxmemory``, each waited out and sent again, for
                                               up to ``room_wait`` seconds (then an error result of
                                               kind ``memory``; rewardq.consumers.retries.RoomWaits)
* ``scoring_seconds{manager,data_source}``     histogram: assemble + batch + manager + commit
* ``in_flight``                                trajectories being scored now
* ``reclaimed_total``                          entries taken over from dead workers
* ``ratelimit_waits_total{kind}`` / ``ratelimit_wait_seconds_total{kind}``
                                               fleet rate-limiter waits (``limited`` manager)
* ``code_trajectories_total{data_source,backend,status}``
                                               code responses scored, by ``code_status``
                                               (``error``: the sandbox failed, no reward)
* ``code_runs_total{data_source,backend}``     programs executed (local processes or
                                               SandboxFusion requests)
* ``code_seconds_total{data_source,backend}``  wall time spent scoring code
* ``code_tripwires_total{data_source,backend,tripwire}``
                                               code responses that tripped a reward-hack wire
                                               (the local ``assert_case`` runner; score 0.0)
* ``judge_requests_total{model}``              LLM-judge HTTP requests (every attempt)
* ``judge_errors_total{model}``                requests that failed (non-200, connection, timeout)
* ``judge_failed_total{model}``                judge calls refused for good (401, 404, 400, ...:
                                               an error result); a judge that is down counts in
                                               ``judge_errors_total`` and its trajectories are
                                               retried in place (``retries_total``)
* ``judge_cache_hits_total{model}``            answers reused instead of paid for
* ``judge_shared_hits_total{model}``           of those, from the cache shared across runs
* ``judge_saved_tokens_total{model}``          tokens (prompt + completion) the hits would have cost
* ``judge_aborted_total{model}``               calls aborted before their answer (a cancelled trajectory)
* ``judge_tokens_total{model,kind}``           tokens the server reported (``prompt``, ``completion``)
* ``judge_error_ratio{model}``                 errors / requests of this worker so far
* ``ledger_rows_total``                        rows this worker wrote to the reward ledger (rewardq.ledger)
* ``ledger_unwritten_total``                   trajectories it scored but could not keep in the ledger
* ``ledger_refused_total``                     keys given no ledger row by design (an index past int32)
* ``ledger_errors_total``                      failed ledger writes (spool or destination)
* ``ledger_unreadable_total``                  spooled frames the flusher could not read back (not in the ledger)
* ``ledger_pending_bytes``                     bytes spooled and not yet written to the ledger
* ``ledger_failing``                           1 while the ledger's last write failed, else 0
* ``reward_mean{data_source}``                 this worker's mean reward over the last 60 s
                                               (rewardq.consumers.reward_health)
* ``reward_error_share{data_source,kind}``     its share of trajectories ending in an error of that kind
* ``reward_latency_p99_ms{data_source}``       its latency p99 (push to result), last 60 s
* ``reward_jump{data_source}``                 1 when the mean reward or error share jumped sharply
                                               from the 10 minutes before (docs/operations.md)
* ``backlog_entries``                          stream entries no worker has been given yet, over
                                               every shard of the namespace (the whole fleet's)
* ``backlog_seconds``                          how long that backlog takes to drain at the fleet's
                                               measured rate (the live workers' outputs scored per
                                               second); ``+Inf`` while entries wait and nothing is
                                               scored. Refreshed every ``maintenance_interval``

Each worker owns a private registry, so several workers in one process (tests, the demo)
never collide.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rewardq.queue.states import NO_DATA_SOURCE

logger = logging.getLogger("rewardq.worker")

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class _LimiterCollector:
    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:  # prometheus_client's Collector protocol
        waits = CounterMetricFamily("rewardq_ratelimit_waits", "Rate-limiter waits", labels=["kind"])
        secs = CounterMetricFamily(
            "rewardq_ratelimit_wait_seconds", "Seconds spent waiting for the rate limiter", labels=["kind"]
        )
        for kind, st in (self._stats() or {}).items():
            if isinstance(st, dict):
                count, seconds = st.get("waits", st.get("count")), st.get("wait_seconds", st.get("seconds"))
            else:
                count, seconds = getattr(st, "count", None), getattr(st, "seconds", None)
            waits.add_metric([kind], float(count or 0))
            secs.add_metric([kind], float(seconds or 0.0))
        yield waits
        yield secs


class _CodeCollector:
    """Code-execution counters per data source, read from ``CodeStats.snapshot`` at scrape time."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:  # prometheus_client's Collector protocol
        labels = ["data_source", "backend"]
        done = CounterMetricFamily(
            "rewardq_code_trajectories", "Code responses scored, by code_status", labels=[*labels, "status"]
        )
        runs = CounterMetricFamily("rewardq_code_runs", "Programs executed to score code", labels=labels)
        secs = CounterMetricFamily("rewardq_code_seconds", "Wall time spent scoring code", labels=labels)
        wires = CounterMetricFamily(
            "rewardq_code_tripwires", "Code responses that tripped a reward-hack wire", labels=[*labels, "tripwire"]
        )
        for ds, st in (self._snapshot() or {}).items():
            for status, n in st.get("statuses", {}).items():
                done.add_metric([ds, st["backend"], status], float(n))
            for wire, n in st.get("tripwires", {}).items():
                wires.add_metric([ds, st["backend"], wire], float(n))
            runs.add_metric([ds, st["backend"]], float(st.get("runs", 0)))
            secs.add_metric([ds, st["backend"]], float(st.get("seconds", 0.0)))
        yield done
        yield runs
        yield secs
        yield wires


class _JudgeCollector:
    """LLM-judge counters per model, read from ``JudgeStats.snapshot`` at scrape time."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:  # prometheus_client's Collector protocol
        from prometheus_client.core import GaugeMetricFamily

        models = self._snapshot() or {}
        if not models:  # a worker without a judge exposes no judge series
            return

        def counter(name: str, doc: str, labels: tuple[str, ...] = ("model",)) -> CounterMetricFamily:
            return CounterMetricFamily(f"rewardq_judge_{name}", doc, labels=list(labels))

        requests = counter("requests", "LLM-judge HTTP requests sent (every attempt)")
        errors = counter("errors", "LLM-judge requests that failed (non-200, connection error, timeout)")
        failed = counter("failed", "LLM-judge calls refused for good (an error result)")
        hits = counter("cache_hits", "LLM-judge answers reused from the cache instead of a request")
        shared = counter("shared_hits", "LLM-judge cache hits from the cache shared across runs (judge_cache=shared)")
        saved = counter("saved_tokens", "Tokens (prompt + completion) the LLM-judge cache hits would have cost")
        aborted = counter("aborted", "LLM-judge calls aborted before their answer (their trajectory was cancelled)")
        tokens = counter("tokens", "Tokens the LLM-judge server reported in usage", ("model", "kind"))
        ratio = GaugeMetricFamily("rewardq_judge_error_ratio", "Failed share of LLM-judge requests", labels=["model"])
        for model, st in models.items():
            requests.add_metric([model], float(st.get("requests", 0)))
            errors.add_metric([model], float(st.get("errors", 0)))
            failed.add_metric([model], float(st.get("failed", 0)))
            hits.add_metric([model], float(st.get("cache_hits", 0)))
            shared.add_metric([model], float(st.get("shared_hits", 0)))
            saved.add_metric([model], float(st.get("saved_tokens", 0)))
            aborted.add_metric([model], float(st.get("aborted", 0)))
            tokens.add_metric([model, "prompt"], float(st.get("prompt_tokens", 0)))
            tokens.add_metric([model, "completion"], float(st.get("completion_tokens", 0)))
            ratio.add_metric([model], float(st.get("error_rate", 0.0)))
        yield from (requests, errors, failed, hits, shared, saved, aborted, tokens, ratio)


class _LedgerCollector:
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:  # prometheus_client's Collector protocol
        st = self._snapshot()
        yield CounterMetricFamily("rewardq_ledger_rows", "Rows written to the reward ledger", value=st["rows"])
        yield CounterMetricFamily(
            "rewardq_ledger_unwritten", "Trajectories scored but not kept in the ledger", value=st["unwritten"]
        )
        yield CounterMetricFamily(
            "rewardq_ledger_refused",
            "Keys given no ledger row by design (an index past int32, a trajectory with no readable record)",
            value=st.get("refused", 0),
        )
        yield CounterMetricFamily("rewardq_ledger_errors", "Failed ledger writes", value=st["errors"])
        yield CounterMetricFamily(
            "rewardq_ledger_unreadable", "Spooled frames not read back: not in the ledger", value=st["unreadable"]
        )
        yield GaugeMetricFamily(
            "rewardq_ledger_pending_bytes", "Bytes spooled, not yet written", value=st["pending_bytes"]
        )
        yield GaugeMetricFamily("rewardq_ledger_failing", "1 while ledger writes fail", value=st["state"] == "failing")


class _HealthCollector:
    def __init__(self, windows: Callable[[], Any]) -> None:
        self._windows = windows

    def collect(self) -> Iterator[Metric]:  # prometheus_client's Collector protocol
        from rewardq.consumers.reward_health import judge

        rows = judge(self._windows())
        mean = GaugeMetricFamily("rewardq_reward_mean", "Mean reward, last 60 s", labels=["data_source"])
        share = GaugeMetricFamily(
            "rewardq_reward_error_share",
            "Share of trajectories with an error, last 60 s",
            labels=["data_source", "kind"],
        )
        p99 = GaugeMetricFamily("rewardq_reward_latency_p99_ms", "Latency p99, last 60 s", labels=["data_source"])
        jump = GaugeMetricFamily("rewardq_reward_jump", "1: mean reward or error share jumped", labels=["data_source"])
        for r in rows:
            ds = r["data_source"]
            if r["mean_reward"] is not None:
                mean.add_metric([ds], r["mean_reward"])
            for kind, v in r["errors_by_kind"].items():
                share.add_metric([ds, kind], v)
            if r["p99_ms"] is not None:
                p99.add_metric([ds], r["p99_ms"])
            jump.add_metric([ds], 1.0 if r["jumps"] else 0.0)
        yield from (mean, share, p99, jump)


class Metrics(Protocol):
    """The hooks a worker calls; :class:`WorkerMetrics` records them, :class:`NoMetrics` drops them."""

    def read(self, n: int) -> None: ...
    def trajectory_done(self, outcome: str, seconds: float, data_source: str = "") -> None: ...
    def dead_letter(self, reason: str) -> None: ...
    def failed(self, kind: str, data_source: str) -> None: ...
    def retried(self, data_source: str) -> None: ...
    def reclaimed(self, n: int) -> None: ...
    def redis_full(self) -> None: ...
    def in_flight(self, n: int, retry_waiting: int = 0) -> None: ...
    def watch_ledger(self, snapshot: Callable[[], dict[str, object]]) -> None: ...
    def watch_health(self, windows: Callable[[], object]) -> None: ...
    def close(self) -> None: ...


class NoMetrics:
    """The worker's metrics when ``--metrics-port`` is not set: every hook does nothing."""

    def read(self, n: int) -> None:
        pass

    def trajectory_done(self, outcome: str, seconds: float, data_source: str = "") -> None:
        pass

    def dead_letter(self, reason: str) -> None:
        pass

    def failed(self, kind: str, data_source: str) -> None:
        pass

    def retried(self, data_source: str) -> None:
        pass

    def reclaimed(self, n: int) -> None:
        pass

    def redis_full(self) -> None:
        pass

    def in_flight(self, n: int, retry_waiting: int = 0) -> None:
        pass

    def watch_ledger(self, snapshot: Callable[[], dict[str, object]]) -> None:
        pass

    def watch_health(self, windows: Callable[[], object]) -> None:
        pass

    def close(self) -> None:
        pass


class WorkerMetrics:
    """The worker's instruments. Call :meth:`serve` to expose them over HTTP."""

    def __init__(
        self,
        manager_name: str,
        limiter_stats: Callable[[], dict[str, Any]] | None = None,
        code_stats: Callable[[], dict[str, Any]] | None = None,
        judge_stats: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.manager_name = manager_name
        r = self.registry
        self.records_read = Counter("rewardq_records_read", "Stream entries read", registry=r)
        self.trajectories = Counter("rewardq_trajectories", "Finished trajectories", ["manager", "outcome"], registry=r)
        self.dead_letters = Counter("rewardq_dead_letters", "Dead letters by reason", ["reason"], registry=r)
        self.failures = Counter(
            "rewardq_failures", "Error results by data source and failure kind", ["data_source", "kind"], registry=r
        )
        self.retries = Counter(
            "rewardq_retries", "Transient failures retried in place, by data source", ["data_source"], registry=r
        )
        self.retry_waiting = Gauge("rewardq_retry_waiting", "Trajectories waiting on a retry", registry=r)
        self.scoring = Histogram(
            "rewardq_scoring_seconds",
            "Time to score and commit one trajectory",
            ["manager", "data_source"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.in_flight_gauge = Gauge("rewardq_in_flight", "Trajectories being scored", registry=r)
        self.reclaimed_total = Counter("rewardq_reclaimed", "Entries reclaimed from dead workers", registry=r)
        self.redis_full_waits = Counter(
            "rewardq_redis_full_waits", "Writes of results Redis refused past maxmemory, waited out", registry=r
        )
        self.backlog_entries = Gauge(
            "rewardq_backlog_entries", "Stream entries no worker has been given yet (whole namespace)", registry=r
        )
        self.backlog_seconds = Gauge(
            "rewardq_backlog_seconds",
            "Seconds the namespace's backlog takes to drain at the fleet's measured rate (+Inf: no progress)",
            registry=r,
        )
        self._backlog_task: asyncio.Task[Any] | None = None
        if limiter_stats is not None:
            r.register(_LimiterCollector(limiter_stats))
        if code_stats is not None:
            r.register(_CodeCollector(code_stats))
        if judge_stats is not None:
            r.register(_JudgeCollector(judge_stats))
        self._server: Any = None

    # -- hooks called by the worker -----------------------------------------------------
    def read(self, n: int) -> None:
        self.records_read.inc(n)

    def trajectory_done(self, outcome: str, seconds: float, data_source: str = "") -> None:
        self.trajectories.labels(self.manager_name, outcome).inc()
        if outcome == "ok":
            self.scoring.labels(self.manager_name, data_source or NO_DATA_SOURCE).observe(seconds)

    def dead_letter(self, reason: str) -> None:
        self.dead_letters.labels(reason).inc()

    def failed(self, kind: str, data_source: str) -> None:
        self.failures.labels(data_source or NO_DATA_SOURCE, kind).inc()

    def retried(self, data_source: str) -> None:
        self.retries.labels(data_source or NO_DATA_SOURCE).inc()

    def reclaimed(self, n: int) -> None:
        self.reclaimed_total.inc(n)

    def redis_full(self) -> None:
        self.redis_full_waits.inc()

    def in_flight(self, n: int, retry_waiting: int = 0) -> None:
        self.in_flight_gauge.set(n)
        self.retry_waiting.set(retry_waiting)

    def watch_ledger(self, snapshot: Callable[[], dict[str, object]]) -> None:
        """Expose the ledger's counters (``snapshot``: :meth:`rewardq.ledger.sink.Ledger.snapshot`)."""
        self.registry.register(_LedgerCollector(snapshot))

    def watch_health(self, windows: Callable[[], object]) -> None:
        """Expose the live reward health (``windows``: :meth:`RewardHealth.windows`)."""
        self.registry.register(_HealthCollector(windows))

    def backlog(self, figures: dict[str, Any]) -> None:
        """Set the backlog gauges from :func:`rewardq.queue.reads.backlog_status`'s figures."""
        self.backlog_entries.set(figures["entries"])
        seconds = figures["seconds"]
        self.backlog_seconds.set(math.inf if seconds is None else seconds)

    def watch_backlog(self, probe: Callable[[], Awaitable[dict[str, Any]]], every: float) -> None:
        """Refresh the backlog gauges from ``probe()`` every ``every`` seconds (until :meth:`close`)."""

        async def loop() -> None:
            while True:
                try:
                    self.backlog(await probe())
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.debug("could not refresh the backlog gauges", exc_info=True)
                await asyncio.sleep(every)

        self._backlog_task = asyncio.get_running_loop().create_task(loop(), name="backlog-gauge")

    # -- exposition -------------------------------------------------------------------------
    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Start the HTTP endpoint (``/metrics``); returns the bound port (``port=0`` picks one)."""
        self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        if self._backlog_task is not None:
            self._backlog_task.cancel()
            self._backlog_task = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
