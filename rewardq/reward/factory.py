"""Build the reward manager a worker runs, from its configuration.

Resolves the manager class (registry, entry point or ``module:Class``), loads the custom
scoring function, and checks the manager's options against its
constructor so a misspelt option fails at start-up, not on the first trajectory.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError
from rewardq.reward.base import ManagerContext, RewardManager
from rewardq.reward.codeexec.settings import OPTION_NAMES as CODE_OPTIONS
from rewardq.reward.codeexec.settings import pop_code_options
from rewardq.reward.execution.settings import ScoringSettings
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
    """Keyword options ``cls.__init__`` takes, and whether it takes ``**kwargs``."""
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
    options: dict[str, Any] | None = None,
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
    try:
        return cls(tokenizer, compute_score, context=context, **options)
    except TypeError as exc:
        raise ConfigError(f"cannot build manager {spec!r}: {exc}") from None


# `cfg` below: a rewardq.config.WorkerConfig, read by attribute (reward/ imports nothing of config's)
def scoring_settings(cfg: Any) -> ScoringSettings:
    """Where the manager's scoring functions run, from a :class:`~rewardq.config.WorkerConfig`."""
    return ScoringSettings(
        reward_fn=cfg.reward_fn or None,
        reward_fn_kwargs=dict(cfg.reward_fn_kwargs or {}),
        reward_fn_placement=cfg.reward_fn_placement,
        processes=cfg.scorer_processes,
        max_spares=cfg.scorer_spares,
    )


def build_from_config(cfg: Any, context: ManagerContext, tokenizer: Tokenizer | None) -> RewardManager:
    """The manager a :class:`~rewardq.config.WorkerConfig` describes, in ``context`` (the worker's
    one context: :func:`rewardq.consumers.compose.manager_context`), decoding with ``tokenizer``."""
    from rewardq.reward.execution.loader import load_score_fn

    score_fn = load_score_fn(cfg.reward_fn, cfg.reward_fn_kwargs) if cfg.reward_fn else None
    options = dict(cfg.manager_options)
    if cfg.reward_fn and "scorer_spec" in accepted_options(get_manager_class(cfg.manager))[0]:
        options.setdefault("scorer_spec", cfg.reward_fn)  # process-isolated managers re-load it in the child
    return build_manager(cfg.manager, tokenizer=tokenizer, compute_score=score_fn, options=options, context=context)
