"""The sessions of one prompt on verl's V1 trainer: a scored session waits to know whether its group
keeps at least two scored sessions; no verl import here.

On the V1 trainer a sample whose reward failed never reaches TransferQueue
(:mod:`rewardq.integrations.verl_policy`), and verl's GRPO groups the sessions present. A group that
failures left with one scored session would then train it alone, and verl's GRPO gives a group of
one the advantage ``score - 0`` over ``1`` (its raw score, not a comparison with anything). The
DataProto trainers' masking estimators leave such a session out
(:mod:`rewardq.integrations.verl_mask`); this is the same rule on V1, where nothing after the
session can drop it.

verl's ``AgentLoopWorkerTQ._run_prompt`` runs all ``n`` sessions of a prompt (its ``uid``) as tasks
of one agent-loop worker and stores a session only when it returns. So rewardq's V1 worker opens a
:class:`SessionGroup` per prompt (:meth:`SessionGroups.open`); a session that got its reward
(:meth:`SessionGroup.scored`) waits until the group is decided, before it is stored; a session that
ends any other way (its reward failed, its agent loop raised) says so on its way out
(:meth:`SessionGroup.ended`). The group is decided as soon as two sessions are scored (it keeps every
scored session), or once every session is scored or ended: then it keeps its scored sessions only if
every session was scored, or if ``n`` is 1 (a group of one by design keeps verl's rule).

Waiting costs nothing in time: verl marks the prompt finished only after every session has ended,
and its replay buffer samples only finished prompts. Validation prompts never wait (no training).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

logger = logging.getLogger("rewardq.verl")


@dataclass
class SessionGroup:
    """The sessions of one prompt and what became of them (module docstring)."""

    n: int
    scored_sessions: set[object] = field(default_factory=set)
    ended_sessions: set[object] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def scored(self, session: object) -> None:
        """``session`` got its reward."""
        self.scored_sessions.add(session)
        self._wake()

    def ended(self, session: object) -> None:
        """``session`` is over (scored or not): a session never scored by then never will be."""
        self.ended_sessions.add(session)
        self._wake()

    def decided(self) -> bool:
        unscored = len(self.ended_sessions - self.scored_sessions)
        return len(self.scored_sessions) >= 2 or len(self.scored_sessions) + unscored >= self.n

    def keeps_scored(self) -> bool:
        """Whether the scored sessions keep their place (call once :meth:`decided`)."""
        ok = len(self.scored_sessions)
        return ok >= 2 or ok >= self.n

    async def wait(self) -> bool:
        """Wait until the group is decided; whether its scored sessions keep their place."""
        while not self.decided():
            await self._changed.wait()
        return self.keeps_scored()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


class SessionGroups:
    """The open :class:`SessionGroup` of each prompt an agent-loop worker runs, by ``uid``."""

    def __init__(self) -> None:
        self._groups: dict[object, SessionGroup] = {}

    def open(self, uid: object, n: int) -> bool:
        """Open the group of ``uid``'s ``n`` sessions; False (nothing opened) when one is open already
        (the same uid run twice at once: its second run keeps verl's rule)."""
        if uid in self._groups:
            logger.warning("rewardq: prompt %s is already running in this agent-loop worker", uid)
            return False
        self._groups[uid] = SessionGroup(n)
        return True

    def close(self, uid: object) -> None:
        self._groups.pop(uid, None)

    def get(self, uid: object) -> SessionGroup | None:
        return self._groups.get(uid)
