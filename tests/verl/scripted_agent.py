"""An agent loop for tests/verl whose responses are scripted: verl's own ``_run_agent_loop`` runs it.

verl instantiates a registered agent loop with hydra and awaits its ``run(sampling_params, **kwargs)``
(``kwargs`` is the dataset row plus ``session_id``); this one answers with the response
:data:`RESPONSES` holds for the row's ``uid`` and the session, and raises for a response ``RAISE``
(an agent loop that fails before any reward).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register

from tests.verl.data import output

#: The agent loop's name in verl's registry (``agent_name`` of a dataset row).
NAME = "rewardq_scripted_test_agent"
#: Per uid, the response of each session.
RESPONSES: dict[str, list[str]] = {}
#: The response that makes the agent loop raise.
RAISE = "RAISE"


@register(NAME)
class ScriptedAgentLoop:
    """Answers with the scripted response; built by verl with its usual keyword arguments."""

    def __init__(self, **_: Any) -> None:
        pass

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        text = RESPONSES[kwargs["uid"]][kwargs["session_id"]]
        if text == RAISE:
            raise RuntimeError("the agent loop failed before any reward")
        return [output(text)]
