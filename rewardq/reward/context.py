"""What the worker hands every manager it hosts (:class:`ManagerContext`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rewardq.queue.connection import split_cluster
from rewardq.queue.keys import NAMESPACE
from rewardq.queue.results import RESULT_TTL
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.codeexec.stats import CodeStats
from rewardq.reward.execution.settings import ScoringSettings
from rewardq.reward.judge.stats import JudgeStats


@dataclass
class ManagerContext:
    """What a manager may need from the worker that hosts it.

    Attributes:
        redis_url: the pipeline's Redis (fleet-wide rate limiters keep their state there).
        namespace: the pipeline's namespace (limiter keys live under it).
        worker_name: the hosting worker's name (for logs and limiter bookkeeping).
        cluster: True when ``redis_url`` is a Redis Cluster (a ``redis+cluster://`` URL says so itself).
        scoring: where scoring functions run (see :class:`ScoringSettings`).
        extra: anything else a deployment wants to hand its custom managers.
        code: how the default scorer runs code (``sandbox_fusion_*`` / ``code_local_*``
            manager options, which every manager accepts; see
            :mod:`rewardq.reward.codeexec.settings`).
        code_stats: code-execution counters per data source (``rewardq status``, ``/metrics``).
        result_ttl: seconds results live in Redis (0: for ever); LLM-judge answers are kept as long.
        judge_stats: LLM-judge counters per model (``/metrics``; see :mod:`rewardq.reward.judge`).
        secret_files: the worker's secret files (Redis URL file, config file): no sandboxed program
            may read them (see :class:`~rewardq.reward.codeexec.sandbox.LocalSandbox`).
    """

    redis_url: str | None = None
    namespace: str = NAMESPACE
    worker_name: str = "local"
    cluster: bool = False
    scoring: ScoringSettings = field(default_factory=ScoringSettings)
    extra: dict[str, Any] = field(default_factory=dict)
    code: CodeExecSettings = field(default_factory=CodeExecSettings)
    code_stats: CodeStats = field(default_factory=CodeStats)
    result_ttl: float = RESULT_TTL
    judge_stats: JudgeStats = field(default_factory=JudgeStats)
    secret_files: tuple[str, ...] = ()
    _code_runtime: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.redis_url is not None:  # a redis+cluster:// URL names a cluster whatever the flag says
            self.cluster = split_cluster(self.redis_url, self.cluster)[1]

    def code_runtime(self) -> Any:
        """The worker's :class:`~rewardq.reward.codeexec.runtime.CodeRuntime` (created on first use)."""
        if self._code_runtime is None:
            from rewardq.reward.codeexec.runtime import CodeRuntime

            self._code_runtime = CodeRuntime(
                self.code,
                stats=self.code_stats,
                redis_url=self.redis_url,
                namespace=self.namespace,
                cluster=self.cluster,
                worker_name=self.worker_name,
                secret_files=self.secret_files,
            )
        return self._code_runtime

    async def aclose(self) -> None:
        """Release what the context created (the code runtime's HTTP session and Redis client)."""
        if self._code_runtime is not None:
            await self._code_runtime.close()
            self._code_runtime = None
