"""The code-execution state of one worker: the chosen backend, its limits, its counters.

A :class:`CodeRuntime` is created on first use by :meth:`ManagerContext.code_runtime
<rewardq.reward.context.ManagerContext.code_runtime>` and closed with the worker. It holds

* the local sandbox (:class:`~rewardq.reward.codeexec.sandbox.LocalSandbox`), or
* the SandboxFusion client, whose requests hold slots of a **fleet** limiter (state in the
  pipeline's Redis under ``<namespace>:ratelimit:sandbox_fusion:<hash of the URL>``, so every
  worker scoring against one sandbox shares ``sandbox_fusion_max_concurrent``); without a
  Redis URL (an embedded run) the limit holds for this process only;
* the per-data-source counters (:class:`~rewardq.reward.codeexec.stats.CodeStats`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from rewardq.queue.keys import NAMESPACE
from rewardq.reward.codeexec.settings import CodeExecSettings
from rewardq.reward.codeexec.stats import CodeStats

if TYPE_CHECKING:
    from rewardq.reward.codeexec.sandbox_fusion import SandboxFusionClient

logger = logging.getLogger("rewardq.reward.codeexec")


class CodeRuntime:
    """Scores code responses with the configured backend (see the module docstring).

    Args:
        settings: the code-execution options.
        stats: where to count (a fresh :class:`CodeStats` by default).
        redis_url, namespace, cluster: the pipeline's Redis, for the fleet limiter.
        worker_name: names this worker's limiter slots.
        secret_files: the worker's secret files (Redis URL file, config file), which no sandboxed
            program may read (see :class:`~rewardq.reward.codeexec.sandbox.LocalSandbox`).
    """

    def __init__(
        self,
        settings: CodeExecSettings | None = None,
        *,
        stats: CodeStats | None = None,
        redis_url: str | None = None,
        namespace: str = NAMESPACE,
        cluster: bool = False,
        worker_name: str = "local",
        secret_files: tuple[str, ...] = (),
    ) -> None:
        self.settings = settings or CodeExecSettings()
        self.stats = stats or CodeStats()
        self.redis_url = redis_url
        self.namespace = namespace
        self.cluster = cluster
        self.worker_name = worker_name
        self.secret_files = secret_files
        self._sandbox: Any = None
        self._client: SandboxFusionClient | None = None
        self._limiter: Any = None

    @property
    def backend(self) -> str:
        return self.settings.backend

    def limiter_key(self) -> str:
        """The fleet limiter's key for this runtime's SandboxFusion URL."""
        from rewardq.queue.keys import Keyspace

        digest = hashlib.sha1(str(self.settings.sandbox_fusion_url).encode()).hexdigest()[:12]
        return Keyspace(self.namespace).ratelimit(f"sandbox_fusion:{digest}")

    def sandbox(self) -> Any:
        """The local sandbox (created on first use)."""
        if self._sandbox is None:
            from rewardq.reward.codeexec.sandbox import LocalSandbox, SandboxLimits

            s = self.settings
            self._sandbox = LocalSandbox(
                SandboxLimits(memory_mb=s.sandbox_fusion_memory_limit_mb),
                isolation=s.code_local_isolation,
                max_concurrent=s.code_local_max_concurrent,
                secrets=self.secret_files,
            )
        return self._sandbox

    def announce(self) -> None:
        """Say at worker start-up what code scoring will do here: the ``rlimits`` warning (at every
        start), then whether the local sandbox runs a correct program (the start-up probe, run now
        unless an event loop is already running): if not, that code data sources will get error
        results, and the fix."""
        if self.backend != "local":
            return
        from rewardq.errors import CodeSandboxError
        from rewardq.reward.codeexec.probe import FIXES

        sandbox = self.sandbox()
        if sandbox.requested == "rlimits":
            sandbox.warn_rlimits()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            try:
                asyncio.run(sandbox.start())
                return
            except CodeSandboxError as exc:
                refusal = str(exc)
        else:  # inside a loop: the probe runs with the first code response; say what is visible now
            reason = sandbox.precheck()
            refusal = "" if not reason else f"namespaces are not available ({reason}). To score code here, {FIXES}"
        if refusal:
            logger.error("code data sources (codecontests, apps, codeforces, taco) will get error results: %s", refusal)

    def client(self) -> SandboxFusionClient:
        """The SandboxFusion client with its limiter (created on first use)."""
        if self._client is None:
            from rewardq.reward.codeexec.sandbox_fusion import SandboxFusionClient
            from rewardq.reward.ratelimit import open_limiter

            s = self.settings
            self._limiter = open_limiter(
                self.redis_url,
                self.limiter_key(),
                cluster=self.cluster,
                max_concurrent=s.sandbox_fusion_max_concurrent,
                holder_prefix=f"{self.worker_name}:{os.getpid()}",
            )
            if self.redis_url is None:
                logger.info("sandbox_fusion: no Redis configured; max_concurrent holds within this process only")
            self._client = SandboxFusionClient(
                str(s.sandbox_fusion_url),
                limiter=self._limiter,
                max_concurrent=s.sandbox_fusion_max_concurrent,
            )
        return self._client

    async def score(self, data_source: str, completion: str, ground_truth: object) -> dict[str, Any]:
        """Score one response; the scorer's dict (see :mod:`~rewardq.reward.codeexec.result`).

        Raises:
            CodeSandboxError, SandboxUnavailableError: the backend failed (not the program).
        """
        s = self.settings
        started = time.perf_counter()
        try:
            if self.backend == "sandbox_fusion":
                from rewardq.reward.codeexec.sandbox_fusion import score_sandbox_fusion

                result = await score_sandbox_fusion(
                    self.client(),
                    completion,
                    ground_truth,
                    memory_limit_mb=s.sandbox_fusion_memory_limit_mb,
                    timeout=s.sandbox_fusion_run_timeout,
                )
            else:
                from rewardq.reward.codeexec.local import score_local

                result = await score_local(
                    self.sandbox(),
                    completion,
                    ground_truth,
                    first_pass_timeout=s.code_local_first_pass_timeout,
                    case_timeout=s.code_local_case_timeout,
                )
        except Exception:
            self.stats.record(str(data_source), self.backend, time.perf_counter() - started, None)
            raise
        self.stats.record(str(data_source), self.backend, time.perf_counter() - started, result)
        return result.as_dict()

    async def close(self) -> None:
        """Close the HTTP session and the limiter's Redis connection."""
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._limiter is not None:
            await self._limiter.close()
            self._limiter = None
