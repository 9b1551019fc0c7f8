"""The sessions of one prompt on verl's V1 trainer: which of them are stored, decided together; no
verl import here.

On the V1 trainer a sample whose reward failed is left out of TransferQueue, and verl's GRPO groups
the sessions present (:mod:`rewardq.integrations.verl.policy`). Two rules need the whole group:

* **A lone scored session is left out.** A group that failures left with one scored session would
  train it alone, and verl's GRPO gives a group of one the advantage ``(score - 0) / 1``: its raw
  score, not a comparison with anything. The DataProto trainers' masking estimators leave such a
  session out (:mod:`rewardq.integrations.verl.mask`); this is the same rule on V1.
* **A failed session leaves quietly when its group keeps others.** A session that raises makes verl
  tag its prompt ``failure``, and verl's asynchronous replay buffer (``trainer.v1.trainer_mode``
  ``colocate_async`` / ``separate_async``) evicts every ``failure`` group whole and generates it
  again: one failed sample would throw away its group's healthy ones. So a failed session whose
  group keeps scored sessions returns without storing anything (verl tags the prompt ``finished``);
  one whose group keeps none raises (``failure``: verl's own handling of a group with no
  trajectory, ``trainer.v1.sampler.sync_refill_failed_groups`` included).

verl's ``AgentLoopWorkerTQ._run_prompt`` runs all ``n`` sessions of a prompt (its ``uid``) as tasks of
one agent-loop worker and stores a session when it returns. So rewardq's V1 worker opens a
:class:`SessionGroup` per training prompt (:meth:`SessionGroups.open`); a session that got its
reward (:meth:`SessionGroup.scored`) or whose reward failed (:meth:`SessionGroup.failed`) waits until
the group is decided, before anything is stored; a session that ends any other way (its agent loop
raised) says so on its way out (:meth:`SessionGroup.ended`). The group is decided as soon as two
sessions are scored (it keeps every scored session), or once every session is accounted for: then
it keeps its scored sessions only if every session was scored, or if ``n`` is 1 (a group of one by
design keeps verl's rule).

Waiting costs nothing in time: verl marks the prompt terminal only after every session has ended,
and its replay buffers sample only terminal prompts. Validation prompts never wait (no training).
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
    unscored_sessions: set[object] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def scored(self, session: object) -> None:
        """``session`` got its reward."""
        self.scored_sessions.add(session)
        self._wake()

    def failed(self, session: object) -> None:
        """``session``'s reward failed."""
        self.unscored_sessions.add(session)
        self._wake()

    def ended(self, session: object) -> None:
        """``session`` is over: one never scored by then never will be."""
        if session not in self.scored_sessions:
            self.unscored_sessions.add(session)
            self._wake()

    def decided(self) -> bool:
        ok = len(self.scored_sessions)
        return ok >= 2 or ok + len(self.unscored_sessions) >= self.n

    def keeps_scored(self) -> bool:
        """Whether the scored sessions are stored (once :meth:`decided`)."""
        ok = len(self.scored_sessions)
        return ok >= 2 or ok >= self.n

    async def wait(self) -> bool:
        """Wait until the group is decided; whether its scored sessions are stored (none are otherwise)."""
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
