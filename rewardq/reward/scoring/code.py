"""Default scorers of the code data sources: ``codecontests``, ``apps``, ``codeforces``, ``taco``.

As verl scores them: through SandboxFusion when ``sandbox_fusion_url`` is configured, else
with the local runner (``prime_code``'s rules, every program isolated in the local sandbox);
the score is the fraction of the first 10 test cases passed. See
:mod:`rewardq.reward.codeexec` and docs/code-execution.md.

The scorers are ``async`` (``placement = "async"``): they wait on child processes or HTTP and
never block the event loop. Built-in managers pass them the worker's
:class:`~rewardq.reward.codeexec.runtime.CodeRuntime` as ``code_runtime``; called without
one (e.g. ``default_compute_score`` used as a library, with verl's keyword arguments
``sandbox_fusion_url`` and ``memory_limit_mb``), a scorer makes a one-off runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rewardq.reward.scoring.placement import place

if TYPE_CHECKING:
    from rewardq.reward.codeexec.runtime import CodeRuntime

#: The data sources verl scores by running code.
CODE_DATA_SOURCES = ("codecontests", "apps", "codeforces", "taco")


def scorer_for(data_source: str) -> Callable[..., object]:
    """The async scorer of ``data_source`` (counted under that name in the code statistics)."""

    async def score(
        solution_str: str,
        ground_truth: object,
        extra_info: dict[str, object] | None = None,
        *,
        code_runtime: CodeRuntime | None = None,
        sandbox_fusion_url: str | None = None,
        memory_limit_mb: int | None = None,
        **_: object,
    ) -> dict[str, Any]:
        if code_runtime is not None:
            return await code_runtime.score(data_source, solution_str, ground_truth)
        from rewardq.reward.codeexec.runtime import CodeRuntime
        from rewardq.reward.codeexec.settings import CodeExecSettings

        runtime = CodeRuntime(
            CodeExecSettings(
                sandbox_fusion_url=sandbox_fusion_url or None,
                sandbox_fusion_memory_limit_mb=memory_limit_mb or CodeExecSettings.sandbox_fusion_memory_limit_mb,
            )
        )
        try:
            return await runtime.score(data_source, solution_str, ground_truth)
        finally:
            await runtime.close()

    score.__qualname__ = score.__name__ = f"score_code_{data_source}"
    return place(score, "async")
