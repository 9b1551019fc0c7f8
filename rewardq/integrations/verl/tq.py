"""What rewardq's V1 agent-loop worker adds to verl's ``AgentLoopWorkerTQ``; no verl import here.

:class:`TransferQueueSessions` is mixed into verl's TransferQueue agent-loop worker
(:class:`rewardq.integrations.verl.RewardqAgentLoopWorkerTQ`, built on first use because verl's V1
module imports ``transfer_queue``):

* a trajectory is scored on the rewardq fleet before verl's own post-processing, which then finds
  it scored (verl's own ``_compute_score`` call returns at once);
* with ``verl_on_error=mask``, a training prompt's sessions are stored as its group decides
  (:mod:`rewardq.integrations.verl.groups`): scored sessions only if at least two are, and a failed
  session leaves quietly when its group keeps others, so verl never evicts the group for it;
* verl's TransferQueue post-processing copies the final output's reward onto the trajectory's other
  outputs after scoring; when the manager gave one reward per output, each output's own reward is
  put back before verl stores it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewardq.errors import SampleMasked
from rewardq.integrations.verl.groups import SessionGroup, SessionGroups

if TYPE_CHECKING:
    from rewardq.integrations.verl.scoring import VerlScorer


class TransferQueueSessions:
    """Mixed in before verl's ``AgentLoopWorkerTQ`` and rewardq's scoring (module docstring); its
    ``super()`` calls reach verl's methods."""

    config: Any

    if TYPE_CHECKING:  # rewardq.integrations.verl.RewardqScoring's, next in the worker's MRO

        def rewardq_scorer(self) -> VerlScorer: ...

        async def _compute_score(self, outputs: list[object], kwargs: dict[str, object]) -> None: ...

    def _rewardq_groups(self) -> SessionGroups:
        groups: SessionGroups = self.__dict__.setdefault("_rewardq_session_groups", SessionGroups())
        return groups

    def _rewardq_group(self, kwargs: dict[str, object]) -> SessionGroup | None:
        return self._rewardq_groups().get(kwargs.get("uid"))

    async def _run_prompt(self, prompt: dict[str, Any], sampling_params: Any, trajectory: Any, **kw: Any) -> None:
        groups = self._rewardq_groups()
        uid = prompt.get("uid")
        opened = False
        if self.rewardq_scorer().drops_lone_sessions and not trajectory.get("validate"):
            n = prompt.get("__rollout_n__", self.config.actor_rollout_ref.rollout.n)  # as verl reads it
            opened = groups.open(uid, int(n))
        try:
            await super()._run_prompt(prompt, sampling_params, trajectory=trajectory, **kw)  # type: ignore[misc]
        finally:
            if opened:
                groups.close(uid)

    async def _run_agent_loop(self, *args: object, **kwargs: object) -> object:
        try:
            return await super()._run_agent_loop(*args, **kwargs)  # type: ignore[misc]
        finally:
            group = self._rewardq_group(kwargs)
            if group is not None:
                group.ended(kwargs.get("session_id"))

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> None:
        outputs = output if isinstance(output, list) else [output]
        if outputs:
            try:
                await self._compute_score(outputs, kwargs=kwargs)  # verl's own call then finds it scored
            except SampleMasked:
                if await self._rewardq_others_stored(kwargs):
                    return  # left out quietly: nothing stored, the prompt stays `finished`
                raise  # the group stores nothing: `failure`, verl's own handling of an empty group
            await self._rewardq_keep_or_drop(outputs[-1], kwargs)
            pinned = self.__dict__.setdefault("_rewardq_pinned", {})
            for o in outputs[:-1]:
                if o.reward_score is not None:
                    pinned[id(o)] = (o.reward_score, o.extra_fields.get("reward_extra_info"))
        try:
            await super()._agent_loop_postprocess(output, validate, **kwargs)  # type: ignore[misc]
        finally:
            for o in outputs:
                self.__dict__.get("_rewardq_pinned", {}).pop(id(o), None)

    async def _rewardq_keep_or_drop(self, final: Any, kwargs: dict[str, Any]) -> None:
        """A scored session of an open group waits for its group's decision (raising SampleMasked
        when the group keeps fewer than two scored sessions)."""
        group = self._rewardq_group(kwargs)
        if group is None or final.reward_score is None:
            return
        group.scored(kwargs.get("session_id"))
        if not await group.wait():
            await self.rewardq_scorer().drop_lone(kwargs.get("uid"), len(group.scored_sessions), group.n)

    async def _rewardq_others_stored(self, kwargs: dict[str, object]) -> bool:
        """A failed session of an open group waits for its group's decision: whether other sessions are stored."""
        group = self._rewardq_group(kwargs)
        if group is None:
            return False
        group.failed(kwargs.get("session_id"))
        return await group.wait() and bool(group.scored_sessions)

    def _compute_multi_modal_inputs(self, output: Any, input_ids: object) -> object:
        # verl calls this once per output between its reward copy and its put to TransferQueue:
        # the one point where a per-output reward can be put back (tests/verl prove it still is)
        pinned = self.__dict__.get("_rewardq_pinned", {}).get(id(output))
        if pinned is not None:
            output.reward_score, output.extra_fields["reward_extra_info"] = pinned
        return super()._compute_multi_modal_inputs(output, input_ids)  # type: ignore[misc]
