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

from rewardq.errors import ConfigError
from rewardq.reward.http import warn_retired_options
from rewardq.reward.options import ManagerOptions, option

#: The local runner's isolation modes (``auto``: namespaces, refusing code where they do not
#: work; never a silent fall back to ``rlimits``, which must be asked for by name).
ISOLATIONS = ("auto", "namespaces", "rlimits")


@dataclass(frozen=True)
class CodeExecSettings(ManagerOptions):
    """The options in the module docstring, declared once (:mod:`rewardq.reward.options`) and checked."""

    sandbox_fusion_url: str | None = option(None, "SandboxFusion's run_code endpoint; unset: the local runner.")
    sandbox_fusion_max_concurrent: int = option(
        64, "SandboxFusion requests in flight across the whole fleet (verl's default).", above=0
    )
    sandbox_fusion_memory_limit_mb: int = option(
        1024, "Memory of one program, MiB (both backends; verl's default).", above=0
    )
    sandbox_fusion_run_timeout: float = option(
        10, "SandboxFusion's compile and run timeout per case, seconds (verl's).", above=0
    )
    sandbox_fusion_attempts: object = option(None, "Ignored, with a warning: the worker's retry_for rules.")
    sandbox_fusion_retry_delay: object = option(None, "Ignored, with a warning: the worker's retry_for rules.")
    code_local_max_concurrent: int | None = option(
        None, "Sandboxes at once in one worker process (unset: one per CPU).", above=0
    )
    code_local_isolation: str = option(
        "auto", "The local runner's isolation: auto (namespaces, or refuse), namespaces or rlimits.", choices=ISOLATIONS
    )
    code_local_first_pass_timeout: float = option(
        5, "Per case, all cases in one process, seconds (prime_code's first pass).", above=0
    )
    code_local_case_timeout: float = option(10, "Per case, one process per case, seconds (prime_code's).", above=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        url = self.sandbox_fusion_url
        if url is not None and not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"sandbox_fusion_url must be an http(s) URL of SandboxFusion's run_code endpoint, got {url!r}"
            )
        warn_retired_options(
            "sandbox_fusion",
            {
                "sandbox_fusion_attempts": self.sandbox_fusion_attempts,
                "sandbox_fusion_retry_delay": self.sandbox_fusion_retry_delay,
            },
        )

    @property
    def backend(self) -> str:
        """``"sandbox_fusion"`` when a URL is set, else ``"local"``."""
        return "sandbox_fusion" if self.sandbox_fusion_url else "local"


#: Every option name :class:`CodeExecSettings` takes.
OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(CodeExecSettings))


def pop_code_options(options: dict[str, object]) -> CodeExecSettings:
    """Remove the code-execution options from ``options`` (in place) and return them validated.

    A ``None`` value means "not set" (verl's config writes ``url: null``).
    """
    taken = {k: options.pop(k) for k in sorted(OPTION_NAMES & set(options))}
    return CodeExecSettings.from_mapping({k: v for k, v in taken.items() if v is not None})
