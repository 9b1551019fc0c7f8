"""LLM judges over OpenAI-compatible chat-completions endpoints (the ``genrm`` manager's parts), in one folder.

* :mod:`~rewardq.reward.judge.client`: one judge call, billed once, limited fleet-wide, one request;
* :mod:`~rewardq.reward.judge.prompt`: the prompt template and the chat messages;
* :mod:`~rewardq.reward.judge.parsing`: reading the score out of an answer;
* :mod:`~rewardq.reward.judge.scores`: the range a score must fall in (``score_range``);
* :mod:`~rewardq.reward.judge.usage`: what an answer counts as against ``max_tpm``;
* :mod:`~rewardq.reward.judge.stats`: this worker's counters per judge model;
* :mod:`~rewardq.reward.judge.cache` and ``judge.lua``: answers billed once across the fleet (the
  answer cache, its send claim, the fleet's counters); :mod:`~rewardq.reward.judge.shared`: the
  cache shared across runs (``judge_cache=shared``, ``rewardq judge-cache``).

The cache sends its commands through the client it is given (typed by :mod:`rewardq.queue.clients`);
its keys are named in :mod:`rewardq.queue.keys`.

A custom manager can use :class:`ChatJudge` directly to ask a judge its own questions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewardq._lazy import lazy_getattr

if TYPE_CHECKING:
    from rewardq.reward.judge.client import ChatJudge, JudgeAnswer, JudgeUnavailable, request_digest
    from rewardq.reward.judge.stats import JudgeStats

#: Imported on first use, so the operator commands that read the cache (``rewardq status``,
#: ``rewardq judge-cache``) load neither the HTTP client nor the rate limiter.
_LAZY = {
    "ChatJudge": "rewardq.reward.judge.client",
    "JudgeAnswer": "rewardq.reward.judge.client",
    "JudgeUnavailable": "rewardq.reward.judge.client",
    "request_digest": "rewardq.reward.judge.client",
    "JudgeStats": "rewardq.reward.judge.stats",
}

__all__ = ["ChatJudge", "JudgeAnswer", "JudgeStats", "JudgeUnavailable", "request_digest"]

__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return __all__
