"""Real verl objects for tests/verl: agent-loop outputs, dataset rows, verl's own expected rewards."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, _InternalAgentLoopOutput
from verl.utils.reward_score import default_compute_score

from rewardq.reward.tokenizer import load_demo_tokenizer

TOK = load_demo_tokenizer()


def output(response: str, prompt: str = "Question?", tool: str = "", **fields: Any) -> AgentLoopOutput:
    """An AgentLoopOutput whose response is ``response`` (after ``tool`` tokens, masked 0, if given)."""
    tool_ids = TOK.encode(tool) if tool else []
    resp_ids = TOK.encode(response)
    ids = tool_ids + resp_ids
    return AgentLoopOutput(
        prompt_ids=TOK.encode(prompt),
        response_ids=ids,
        response_mask=[0] * len(tool_ids) + [1] * len(resp_ids),
        num_turns=2,
        metrics=AgentLoopMetrics(),
        extra_fields={"raw_prompt": [{"role": "user", "content": prompt}], **fields},
    )


def row(data_source: str, ground_truth: Any, uid: str | None = None, index: int = 0) -> dict[str, Any]:
    """A dataset row as verl hands it to the agent loop (numpy scalars included)."""
    return {
        "data_source": data_source,
        "reward_model": {"ground_truth": ground_truth, "style": "rule"},
        "extra_info": {"index": index, "split": "train"},
        "raw_prompt": np.array([{"role": "user", "content": "Question?"}], dtype=object),
        "uid": uid or str(uuid.uuid4()),
        "index": np.int64(index),
        "agent_name": "single_turn_agent",
    }


def verl_expected(outputs: list[AgentLoopOutput], kwargs: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """What verl's naive reward manager gives: default_compute_score on the decoded final response,
    a dict result as (score, the dict), a number as (number, {"acc": number})."""
    final = outputs[-1]
    text = TOK.decode(final.response_ids, skip_special_tokens=True)
    result = default_compute_score(
        kwargs["data_source"], text, kwargs["reward_model"]["ground_truth"], dict(kwargs["extra_info"])
    )
    if isinstance(result, dict):
        return float(result["score"]), dict(result)
    return float(result), {"acc": result}


def internal(out: AgentLoopOutput, prompt_width: int = 16, response_width: int = 24) -> _InternalAgentLoopOutput:
    """The padded form verl's ``_agent_loop_postprocess`` hands to ``_postprocess``."""
    p, r = list(out.prompt_ids)[-prompt_width:], list(out.response_ids)[:response_width]
    prompt = torch.zeros(1, prompt_width, dtype=torch.long)
    prompt[0, prompt_width - len(p) :] = torch.tensor(p)
    response = torch.zeros(1, response_width, dtype=torch.long)
    response[0, : len(r)] = torch.tensor(r)
    attention = torch.cat(
        [(torch.arange(prompt_width) >= prompt_width - len(p)), (torch.arange(response_width) < len(r))]
    ).long()[None]
    return _InternalAgentLoopOutput(
        prompt_ids=prompt,
        response_ids=response,
        input_ids=torch.cat([prompt, response], dim=1),
        position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
        response_mask=(torch.arange(response_width) < len(r)).long()[None],
        attention_mask=attention,
        reward_score=out.reward_score,
        num_turns=out.num_turns,
        metrics=out.metrics,
        extra_fields=out.extra_fields,
    )
