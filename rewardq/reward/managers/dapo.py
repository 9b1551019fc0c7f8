"""``dapo``: the final output's score plus DAPO's soft overlong penalty.

DAPO (Yu et al., 2025) punishes responses that run into the generation limit, softly:
no penalty up to ``max_resp_len - L`` tokens, then a penalty growing linearly to
``-penalty_factor`` at ``max_resp_len``. With ``L = overlong_buffer["len"]``::

    expected = max_resp_len - L
    exceed   = valid_response_length - expected
    penalty  = min(-exceed / L * penalty_factor, 0)
    reward   = score + penalty

``valid_response_length`` is the number of valid tokens of the final output's response
(tool/observation tokens included, padding excluded). Example: ``max_resp_len=4``,
``L=2``, ``penalty_factor=1``, a 4-token response → ``expected=2``, ``exceed=2``,
``penalty=-1.0``; a 3-token one → ``-0.5``; 2 tokens or fewer → ``0``.

With ``overlong_buffer["log"]`` the result's ``reward_extra_info`` also holds
``overlong_reward`` (the penalty) and ``overlong`` (``penalty < 0``).

Unlike ``naive``, ``dapo`` passes ``extra_info`` to the scorer as the dataset has it
(no ``extra_fields`` merge, no ``num_turns``), as verl's dapo manager does, but still as
a copy.

Config (verl ``reward_kwargs``: ``overlong_buffer_cfg`` → ``overlong_buffer``)::

    --manager dapo --manager-option max_resp_len=4096 \\
        --manager-option 'overlong_buffer={"enable": true, "len": 512, "penalty_factor": 1.0, "log": true}'
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError
from rewardq.reward.base import ManagerContext, RewardManager, ScoreFn
from rewardq.reward.final_output import aread_final_output, score_final_output
from rewardq.reward.registry import register
from rewardq.reward.results import to_float

if TYPE_CHECKING:
    from tensordict import TensorDict

    from rewardq.reward.tokenizer import Tokenizer

logger = logging.getLogger("rewardq.reward")


@dataclass(frozen=True)
class OverlongBuffer:
    """The validated ``overlong_buffer`` option (verl's defaults for missing keys).

    An enabled buffer is checked against ``max_resp_len`` (see the manager's Raises);
    a disabled one is only type-checked, since it never changes a reward (verl asserts
    ``max_resp_len >= len`` even then).
    """

    enable: bool = False
    len: int = 0
    penalty_factor: float = 0.0
    log: bool = False

    @classmethod
    def from_option(cls, value: object, max_resp_len: object) -> OverlongBuffer | None:
        """Validate ``overlong_buffer`` together with ``max_resp_len``; ConfigError names the bad value."""
        if value is None:
            return None
        if isinstance(value, OverlongBuffer):
            value = {"enable": value.enable, "len": value.len, "penalty_factor": value.penalty_factor, "log": value.log}
        if not isinstance(value, dict):
            raise ConfigError(
                f"dapo: overlong_buffer must be a dict {{enable, len, penalty_factor, log}}, "
                f"got {type(value).__name__} {value!r:.80}"
            )
        unknown = sorted(set(value) - {"enable", "len", "penalty_factor", "log"})
        if unknown:
            raise ConfigError(
                f"dapo: overlong_buffer does not take {unknown}; it takes enable, len, penalty_factor, log"
            )
        cfg = cls(**value)
        for key in ("enable", "log"):
            if not isinstance(getattr(cfg, key), bool):
                raise ConfigError(f"dapo: overlong_buffer.{key} must be true or false, got {getattr(cfg, key)!r}")
        if isinstance(cfg.len, bool) or not isinstance(cfg.len, numbers.Integral):
            raise ConfigError(f"dapo: overlong_buffer.len must be an integer number of tokens, got {cfg.len!r}")
        if isinstance(cfg.penalty_factor, bool) or not isinstance(cfg.penalty_factor, numbers.Real):
            raise ConfigError(f"dapo: overlong_buffer.penalty_factor must be a number, got {cfg.penalty_factor!r}")
        if not cfg.enable:
            return cfg
        if max_resp_len is None:
            raise ConfigError(
                "dapo: overlong_buffer.enable is true but max_resp_len is not set; set max_resp_len "
                "to the rollout's maximum response length (verl: data.max_response_length)"
            )
        if cfg.len <= 0:
            raise ConfigError(
                f"dapo: overlong_buffer.len must be positive when the overlong penalty is enabled, "
                f"got {cfg.len}; to disable the penalty set overlong_buffer.enable=false"
            )
        if max_resp_len < cfg.len:
            raise ConfigError(
                f"dapo: max_resp_len={max_resp_len} is smaller than overlong_buffer.len={cfg.len}; "
                "the buffer is the last `len` tokens before max_resp_len"
            )
        if cfg.penalty_factor < 0:
            raise ConfigError(f"dapo: overlong_buffer.penalty_factor must be >= 0, got {cfg.penalty_factor}")
        if cfg.penalty_factor == 0:
            logger.warning("dapo: overlong penalty enabled with penalty_factor=0, so it never changes a reward")
        return cfg

    def penalty(self, valid_response_length: int, max_resp_len: int) -> float:
        """``min(-(length - (max_resp_len - len)) / len * penalty_factor, 0)`` as a plain float."""
        expected = max_resp_len - self.len
        exceed = valid_response_length - expected
        return float(min(-exceed / self.len * self.penalty_factor, 0))


@register("dapo")
class DAPORewardManager(RewardManager):
    """verl's ``dapo`` manager (see the module docstring).

    Args:
        tokenizer: decodes response ids.
        compute_score: the scoring function; None uses the default scorer by data source.
        context: see :class:`~rewardq.reward.context.ManagerContext`.
        overlong_buffer: ``{"enable": bool, "len": int, "penalty_factor": float, "log": bool}``
            or None (no penalty).
        max_resp_len: the rollout's maximum response length in tokens; required when
            the penalty is enabled.

    Raises:
        ConfigError: enabled without ``max_resp_len``, ``len <= 0``, ``max_resp_len < len``,
            or a malformed ``overlong_buffer``.
    """

    reads = "final"  # run_single reads data[-1:] only

    def __init__(
        self,
        tokenizer: Tokenizer,
        compute_score: ScoreFn | None = None,
        *,
        context: ManagerContext | None = None,
        overlong_buffer: Mapping[str, object] | None = None,
        max_resp_len: int | None = None,
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        if max_resp_len is not None and (
            isinstance(max_resp_len, bool) or not isinstance(max_resp_len, numbers.Integral) or max_resp_len <= 0
        ):
            raise ConfigError(f"dapo: max_resp_len must be a positive integer, got {max_resp_len!r}")
        self.max_resp_len = max_resp_len
        self.overlong_buffer = OverlongBuffer.from_option(overlong_buffer, max_resp_len)

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        final = await aread_final_output(self, data)  # the final row only: data[-1:] (last_row)
        result = await score_final_output(self, final, final.extra_info)
        cfg = self.overlong_buffer
        if cfg is not None and cfg.enable:
            assert self.max_resp_len is not None  # OverlongBuffer.from_option refuses an enabled buffer without it
            penalty = cfg.penalty(final.valid_response_length, self.max_resp_len)
            result["reward_score"] = to_float(result["reward_score"] + penalty)
            if cfg.log:
                result["reward_extra_info"]["overlong_reward"] = penalty
                result["reward_extra_info"]["overlong"] = penalty < 0
        return result
