"""The result of one output key, as stored in its ``reward`` hash and returned to clients.

Everything in the hash is readable text, so ``redis-cli HGETALL`` shows it as is::

    status             ok | error
    reward_score       "1.0"            (empty for errors)
    reward_extra_info  '{"acc": 1.0}'   (JSON)
    error              ""               (the reason, for errors)
    worker, manager, scored_at, latency_ms
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rewardq.queue.states import ResultStatus

#: The two statuses by their older names (:class:`~rewardq.queue.states.ResultStatus`).
STATUS_OK = ResultStatus.OK
STATUS_ERROR = ResultStatus.ERROR


def as_text(value: Any) -> str:
    """A Redis reply value as text (bytes decoded as UTF-8, undecodable bytes replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def to_jsonable(value: Any) -> Any:
    """Plain-JSON copy of a reward_extra_info value (numpy / torch scalars become numbers)."""
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays
        return to_jsonable(value.tolist())
    if hasattr(value, "item"):
        return to_jsonable(value.item())
    return str(value)


@dataclass
class RewardResult:
    """The reward of one output key.

    Attributes:
        key: ``<uid>_<session_id>_<i>``.
        status: a :class:`~rewardq.queue.states.ResultStatus` (``"ok"`` or ``"error"``).
        reward_score: the reward (a plain float), None for errors.
        reward_extra_info: the manager's extra metrics (``acc``, ``pred``, ...); for
            errors ``{"error": reason}`` so downstream filters never meet a missing dict.
        error: why scoring failed, None when ok.
    """

    key: str
    status: str
    reward_score: float | None
    reward_extra_info: dict = field(default_factory=dict)
    error: str | None = None
    worker: str = ""
    manager: str = ""
    scored_at: float = 0.0
    latency_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    def extra_info_json(self) -> str:
        """``reward_extra_info`` as stored: compact JSON of :func:`to_jsonable`."""
        return json.dumps(to_jsonable(self.reward_extra_info), ensure_ascii=False, separators=(",", ":"))

    def to_hash(self, extra_info_json: str | None = None) -> dict[str, str]:
        """The fields written to Redis (all text). ``extra_info_json``: :meth:`extra_info_json`,
        when the caller already has it (one dict shared by every key of a trajectory)."""
        return {
            "status": self.status,
            "reward_score": "" if self.reward_score is None else repr(float(self.reward_score)),
            "reward_extra_info": self.extra_info_json() if extra_info_json is None else extra_info_json,
            "error": self.error or "",
            "worker": self.worker,
            "manager": self.manager,
            "scored_at": f"{self.scored_at:.6f}",
            "latency_ms": "" if self.latency_ms is None else f"{self.latency_ms:.3f}",
        }

    @classmethod
    def from_hash(cls, key: str, h: Mapping[Any, Any]) -> RewardResult:
        d = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in h.items()
        }
        score = d.get("reward_score") or ""
        latency = d.get("latency_ms") or ""
        try:
            extra = json.loads(d.get("reward_extra_info") or "{}")
        except ValueError:
            extra = {"raw": d.get("reward_extra_info")}
        return cls(
            key=key,
            status=_status(d.get("status")),
            reward_score=float(score) if score else None,
            reward_extra_info=extra,
            error=d.get("error") or None,
            worker=d.get("worker", ""),
            manager=d.get("manager", ""),
            scored_at=float(d.get("scored_at") or 0.0),
            latency_ms=float(latency) if latency else None,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "status": self.status,
            "reward_score": self.reward_score,
            "reward_extra_info": self.reward_extra_info,
            "error": self.error,
            "worker": self.worker,
            "manager": self.manager,
            "scored_at": self.scored_at,
            "latency_ms": self.latency_ms,
        }


def _status(text: str | None) -> str:
    """A stored status as its :class:`ResultStatus` (an unknown word is kept as it is)."""
    try:
        return ResultStatus(text or ResultStatus.ERROR)
    except ValueError:
        return str(text)


def same_fields(a: RewardResult, b: RewardResult) -> bool:
    """Whether ``a`` and ``b`` store the same hash fields (their keys aside): the same values
    and the very same extra-info dict, as when one manager result is copied to every key."""
    return (
        a.reward_extra_info is b.reward_extra_info
        and a.status == b.status
        and a.reward_score == b.reward_score
        and a.error == b.error
        and a.worker == b.worker
        and a.manager == b.manager
        and a.scored_at == b.scored_at
        and a.latency_ms == b.latency_ms
    )
