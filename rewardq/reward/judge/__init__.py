"""LLM judges over OpenAI-compatible chat-completions endpoints (the ``genrm`` manager's parts).

* :mod:`~rewardq.reward.judge.client`: one judge call, billed once, limited fleet-wide, retried;
* :mod:`~rewardq.reward.judge.prompt`: the prompt template and the chat messages;
* :mod:`~rewardq.reward.judge.parsing`: reading the score out of an answer;
* :mod:`~rewardq.reward.judge.scores`: the range a score must fall in (``score_range``);
* :mod:`~rewardq.reward.judge.usage`: what an answer counts as against ``max_tpm``;
* :mod:`~rewardq.reward.judge.stats`: this worker's counters per judge model.

A custom manager can use :class:`ChatJudge` directly to ask a judge its own questions.
"""

from rewardq.reward.judge.client import ChatJudge, JudgeAnswer, JudgeUnavailable, RetryPolicy, request_digest
from rewardq.reward.judge.stats import JudgeStats

__all__ = ["ChatJudge", "JudgeAnswer", "JudgeStats", "JudgeUnavailable", "RetryPolicy", "request_digest"]
