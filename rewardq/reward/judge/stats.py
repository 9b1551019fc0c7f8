"""Counters of LLM-judge calls per model, for one worker (``/metrics``).

The fleet's totals live in Redis (:mod:`rewardq.reward.judge.cache`, read by ``rewardq status``);
these are the same counters for this process, exposed as Prometheus counters.
"""

from __future__ import annotations

from rewardq.reward.judge.cache import COUNTERS


class JudgeStats:
    """``{model: {counter: n}}`` for the counters of :data:`rewardq.reward.judge.cache.COUNTERS`:

    * ``requests``: HTTP requests sent (every attempt, retries included);
    * ``errors``: requests that failed (a status other than 200, a connection error, a timeout);
    * ``failed``: judge calls refused for good (a 4xx: the trajectory got an error result);
    * ``answers``: requests answered with a usable answer;
    * ``cache_hits``: answers reused from the cache instead of a request;
    * ``prompt_tokens`` / ``completion_tokens``: what the server reported in ``usage``;
    * ``aborted``: calls given up before their answer (their trajectory was cancelled);
    * ``shared_hits``: the cache hits that came from the shared cache (``judge_cache=shared``);
    * ``saved_tokens``: the tokens (prompt + completion) the cache hits would have cost.
    """

    def __init__(self) -> None:
        self.models: dict[str, dict[str, int]] = {}

    def add(self, model: str, **increments: int) -> None:
        mine = self.models.setdefault(model, dict.fromkeys(COUNTERS, 0))
        for name, n in increments.items():
            mine[name] += int(n)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """``{model: {counters..., error_rate}}`` (JSON-able); ``error_rate`` = errors / requests."""
        out: dict[str, dict[str, float]] = {}
        for model, c in sorted(self.models.items()):
            out[model] = {**c, "error_rate": round(c["errors"] / c["requests"], 4) if c["requests"] else 0.0}
        return out
