"""Code-execution settings: which backend scores code, and its limits.

They are manager options (``--manager-option sandbox_fusion_url=http://...``, a config file's
``manager_options``, ``REWARDQ_MANAGER_OPTIONS``), accepted by every manager: the factory
takes them out of the options before building the manager and hands them to the scorer
through :class:`~rewardq.reward.context.ManagerContext` (``context.code``). verl's
``reward.sandbox_fusion.{url,max_concurrent,memory_limit_mb}`` map to the first three.

=====================================  =========  ============================================
option                                 default    what it sets
=====================================  =========  ============================================
``sandbox_fusion_url``                 none       the ``run_code`` endpoint; unset: local runner
``sandbox_fusion_max_concurrent``      64         requests in flight across the whole fleet
``sandbox_fusion_memory_limit_mb``     1024       memory of one program (both backends)
``sandbox_fusion_run_timeout``         10         compile and run timeout per case, seconds
``code_local_max_concurrent``          CPUs       sandboxes at once in one worker process
``code_local_isolation``               auto       ``auto`` (= namespaces, or refuse) | ``rlimits``
``code_local_first_pass_timeout``      5          per case, all cases in one process, seconds
``code_local_case_timeout``            10         per case, one process per case, seconds
=====================================  =========  ============================================

``sandbox_fusion_attempts`` and ``sandbox_fusion_retry_delay`` are accepted and ignored, with a
warning: a request is sent once, and a sandbox that is down (no answer, a 5xx) is a ``transient``
failure the worker retries in place until its ``retry_for`` runs out (the one retry policy).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rewardq import defaults
from rewardq.errors import ConfigError
from rewardq.reward.http import warn_retired_options

#: The local runner's isolation modes (``auto``: namespaces, refusing code where they do not
#: work; never a silent fall back to ``rlimits``, which must be asked for by name).
ISOLATIONS = ("auto", "namespaces", "rlimits")


@dataclass(frozen=True)
class CodeExecSettings:
    """The options in the module docstring, validated."""

    sandbox_fusion_url: str | None = None
    sandbox_fusion_max_concurrent: int = defaults.SANDBOX_FUSION_MAX_CONCURRENT
    sandbox_fusion_memory_limit_mb: int = defaults.CODE_MEMORY_LIMIT_MB
    sandbox_fusion_run_timeout: float = defaults.SANDBOX_FUSION_RUN_TIMEOUT
    sandbox_fusion_attempts: object = None
    sandbox_fusion_retry_delay: object = None
    code_local_max_concurrent: int | None = None
    code_local_isolation: str = "auto"
    code_local_first_pass_timeout: float = defaults.CODE_FIRST_PASS_TIMEOUT
    code_local_case_timeout: float = defaults.CODE_CASE_TIMEOUT

    def __post_init__(self) -> None:
        url = self.sandbox_fusion_url
        if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
            raise ConfigError(
                f"sandbox_fusion_url must be an http(s) URL of SandboxFusion's run_code endpoint, got {url!r}"
            )
        for name in ("sandbox_fusion_max_concurrent", "sandbox_fusion_memory_limit_mb"):
            _check(name, getattr(self, name), integer=True)
        for name in ("sandbox_fusion_run_timeout", "code_local_first_pass_timeout", "code_local_case_timeout"):
            _check(name, getattr(self, name), integer=False)
        if self.code_local_max_concurrent is not None:
            _check("code_local_max_concurrent", self.code_local_max_concurrent, integer=True)
        warn_retired_options(
            "sandbox_fusion",
            {
                "sandbox_fusion_attempts": self.sandbox_fusion_attempts,
                "sandbox_fusion_retry_delay": self.sandbox_fusion_retry_delay,
            },
        )
        if self.code_local_isolation not in ISOLATIONS:
            raise ConfigError(
                f"code_local_isolation must be one of {', '.join(ISOLATIONS)}, got {self.code_local_isolation!r}"
            )

    @property
    def backend(self) -> str:
        """``"sandbox_fusion"`` when a URL is set, else ``"local"``."""
        return "sandbox_fusion" if self.sandbox_fusion_url else "local"


def _check(name: str, value: object, *, integer: bool) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float)) and value > 0
    if not ok:
        raise ConfigError(f"{name} must be {'an integer' if integer else 'a number'} > 0, got {value!r}")


#: Every option name :class:`CodeExecSettings` takes.
OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(CodeExecSettings))


def pop_code_options(options: dict[str, Any]) -> CodeExecSettings:
    """Remove the code-execution options from ``options`` (in place) and return them validated.

    A ``None`` value means "not set" (verl's config writes ``url: null``).
    """
    taken = {k: options.pop(k) for k in sorted(OPTION_NAMES & set(options))}
    return CodeExecSettings(**{k: v for k, v in taken.items() if v is not None})
