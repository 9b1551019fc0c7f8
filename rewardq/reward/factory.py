"""Build the reward manager a worker runs, from its configuration.

Resolves the manager class (registry, entry point or ``module:Class``), loads the custom
scoring function, and checks the manager's options so a misspelt option fails at start-up, not
on the first trajectory: against the options the manager declares
(:class:`~rewardq.reward.options.ManagerOptions`, which also parse and bound each value), else
against its constructor's keywords.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError
from rewardq.reward.base import ManagerContext, RewardManager
from rewardq.reward.codeexec.settings import OPTION_NAMES as CODE_OPTIONS
from rewardq.reward.codeexec.settings import pop_code_options
from rewardq.reward.options import options_class
from rewardq.reward.registry import get_manager_class

if TYPE_CHECKING:
    from rewardq.reward.tokenizer import Tokenizer

logger = logging.getLogger("rewardq.reward")

#: Options a verl config carries for some managers only (verl's reward loop hands them to
#: whichever manager is selected); dropped, in one log line, when the selected manager does not
#: take them, instead of failing the start-up.
VERL_SHARED_OPTIONS = frozenset(
    {
        "max_concurrent",
        "max_rpm",
        "max_tpm",
        "estimated_tokens_per_request",
        "timeout",
        "num_workers",
        "overlong_buffer",
        "max_resp_len",
        "experiment_name",
        "sandbox_fusion_url",
        "sandbox_fusion_max_concurrent",
        "sandbox_fusion_memory_limit_mb",
    }
)


def accepted_options(cls: type) -> tuple[set[str], bool]:
    """The options ``cls`` takes (its declared ones, else its constructor's keywords), and whether
    it takes any other (``**kwargs`` without a declaration)."""
    declared = options_class(cls)
    if declared is not None:
        return set(declared.declared()), False
    sig = inspect.signature(cls)  # the constructor's parameters, without self
    names, var_kw = set(), False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            var_kw = True
        elif p.name not in ("self", "tokenizer", "compute_score", "context") and p.kind in (
            p.KEYWORD_ONLY,
            p.POSITIONAL_OR_KEYWORD,
        ):
            names.add(p.name)
    return names, var_kw


def build_manager(
    spec: str,
    *,
    tokenizer: Tokenizer | None,
    compute_score: Any = None,
    options: Mapping[str, object] | None = None,
    context: ManagerContext | None = None,
) -> RewardManager:
    """Instantiate manager ``spec`` with its options; raises ConfigError naming what is wrong.

    The code-execution options (``sandbox_fusion_*``, ``code_local_*``) configure the default
    scorer, not the manager: every manager accepts them, and they reach the scorer as
    ``context.code``.
    """
    cls = get_manager_class(spec)
    options = dict(options or {})
    if CODE_OPTIONS & set(options):
        context = context or ManagerContext()
        context.code = pop_code_options(options)
    names, var_kw = accepted_options(cls)
    if not var_kw:
        extra = sorted(set(options) - names)
        for key in extra:
            if key not in VERL_SHARED_OPTIONS:
                raise ConfigError(
                    f"manager {spec!r} does not take option {key!r}; it takes {sorted(names) or 'no options'}"
                )
        if extra:
            logger.info("manager %s does not use the verl option(s) %s; ignoring them", spec, ", ".join(extra))
            for key in extra:
                options.pop(key)
    declared = options_class(cls)
    try:
        if declared is not None:
            built: Any = cls  # a manager that declares options takes them as one object, ``options=``
            manager: RewardManager = built(
                tokenizer, compute_score, context=context, options=declared.from_mapping(options)
            )
            return manager
        return cls(tokenizer, compute_score, context=context, **options)
    except TypeError as exc:
        raise ConfigError(f"cannot build manager {spec!r}: {exc}") from None
