"""Stopping a verl run from the reward side, on every trainer; no verl import here.

On verl's DataProto trainers (legacy, one-step-off, fully-async) an exception raised while a
trajectory is scored reaches the trainer: ``generate_sequences`` gathers its agent loops without
``return_exceptions``. On the V1 trainer it does not: ``AgentLoopWorkerTQ._run_prompt`` gathers a
prompt's sessions with ``return_exceptions=True``, logs the error and tags the group ``failure``,
and the replay buffer trains on the rest.

What the V1 trainer does not swallow is its replay buffer's own check of the group tags:
``ReplayBuffer._sync_metadata_from_transfer_queue`` (run by ``sample`` in the trainer's process at
every poll, before any group is selected) raises ``ValueError("Unknown status: ...")`` for a prompt
tag whose status it does not know. :func:`hand_to_trainer` puts such a tag, whose status is the
stop message, under a key of its own (:data:`STOP_KEY`, which no session writes, so verl's
``failure``/``finished`` tags cannot overwrite it). It is put before the session raises, hence
before its group can turn terminal: the trainer's next poll raises with rewardq's message, so it
never samples the group that met the failure. That is the step's own check, in verl's own process.
"""

from __future__ import annotations

import logging

from rewardq.errors import RewardqError

logger = logging.getLogger("rewardq.verl")

#: The TransferQueue key of the stop tag (a prompt key no uid can be: uids are UUIDs).
STOP_KEY = "rewardq-stop"
#: The partition the tag goes to: ``sample`` reads every partition's tags, training's included.
PARTITION = "train"


def _tq() -> object:
    """The ``transfer_queue`` client of this process, attached to the run's controller if needed
    (verl's agent-loop workers attach in their ``__init__``; a reward-loop actor has not)."""
    import transfer_queue as tq

    try:
        tq.get_client()
    except Exception:  # noqa: BLE001 - not attached yet in this process: attach to the run's controller
        tq.init()
    return tq


async def hand_to_trainer(message: str) -> bool:
    """Put the stop tag whose status is ``message``: the V1 trainer's next replay-buffer poll raises
    ``ValueError("Unknown status: <message>")``. False (and logged) when TransferQueue is unreachable."""
    try:
        tq: object = _tq()
        tag = {"is_prompt": True, "status": message, "global_steps": 0}
        await tq.async_kv_put(key=STOP_KEY, partition_id=PARTITION, tag=tag)  # type: ignore[attr-defined]
    except Exception:  # the raise that follows still fails this session; say so loudly
        logger.exception("rewardq: could not hand the stop to verl's V1 trainer through TransferQueue: %s", message)
        return False
    return True


async def stop_run(error: RewardqError, on_v1: bool) -> None:
    """Raise ``error``, first handing it to the V1 trainer (``on_v1``), which would swallow the raise."""
    if on_v1:
        await hand_to_trainer(f"{error} [raised by rewardq in a V1 agent loop: verl's _run_prompt swallows it]")
    logger.error("%s", error)
    raise error
