"""Reward functions and a manager that misbehave on request, for the isolation tests.

The decoded response says what to do:

``hang``              never return (``time.sleep`` in a loop)
``exit:<code>``       ``os._exit(code)``
``sysexit:<code>``    ``sys.exit(code)``
``interrupt``         raise ``KeyboardInterrupt``
``segfault``          a real segmentation fault (ctypes reads address 0)
``gil:<seconds>``     hold the GIL that long (libc ``sleep`` through ``ctypes.PyDLL``, which
                      does not release it)
``stubborn``          ignore SIGTERM, then hang
``raise``             raise ``ValueError``
anything else         1.0 when it equals the ground truth, else 0.0

With ``MISBEHAVING_MARKS=<dir>`` in the environment, ``hang`` and ``stubborn`` first create
``<dir>/<verb>-<pid>``, so a test knows the call started and which process runs it.

Loaded by workers as ``--reward-fn tests/support/misbehaving.py:misbehave`` (sync),
``...:misbehave_async`` (async), or ``--manager tests.support.misbehaving:MisbehavingManager``.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import time
from typing import Any

from rewardq.reward.base import RewardManager


def _act(text: str) -> None:
    """Do what ``text`` asks for (see the module docstring); return normally otherwise."""
    verb, _, arg = text.partition(":")
    marks = os.environ.get("MISBEHAVING_MARKS")
    if marks and verb in ("hang", "stubborn"):
        with open(os.path.join(marks, f"{verb}-{os.getpid()}"), "w") as f:
            f.write(text)
    if verb == "hang":
        while True:
            time.sleep(1)
    if verb == "exit":
        os._exit(int(arg))
    if verb == "sysexit":
        sys.exit(int(arg))
    if verb == "interrupt":
        raise KeyboardInterrupt
    if verb == "segfault":
        ctypes.string_at(0)
    if verb == "gil":
        ctypes.PyDLL(None).sleep(int(arg))
    if verb == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    if verb == "raise":
        raise ValueError("this answer is refused on purpose")


def misbehave(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """A sync reward function: does what the response says (module docstring), else exact match."""
    _act(solution_str)
    return 1.0 if solution_str == str(ground_truth) else 0.0


async def misbehave_async(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The async flavour: ``hang`` awaits forever instead of blocking; the rest as :func:`misbehave`."""
    if solution_str == "hang":
        await asyncio.sleep(3600)
    await asyncio.sleep(0)
    _act(solution_str)
    return 1.0 if solution_str == str(ground_truth) else 0.0


class MisbehavingManager(RewardManager):
    """A custom manager whose ``run_single`` itself misbehaves, in the worker's own process.

    Besides :func:`misbehave`'s verbs: ``thread-hang`` leaves a hung thread in asyncio's
    default executor (``asyncio.to_thread``) and waits for it; ``fn:<verb>`` hands ``<verb>``
    to the worker's reward function (``--reward-fn``) through ``call_score_fn``, as the
    built-in managers do. Every trajectory first waits ``delay`` seconds, so the trajectories
    read in one batch are all in flight at once.
    """

    name = "test-misbehaving"

    def __init__(
        self, tokenizer: Any = None, compute_score: Any = None, *, context: Any = None, delay: float = 0.5
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        self.delay = float(delay)

    async def run_single(self, data: Any) -> dict[str, Any]:
        from rewardq.reward.final_output import read_final_output  # torch: not in scorer processes

        final = read_final_output(self, data)
        await asyncio.sleep(self.delay)
        if final.solution_str.startswith("fn:"):
            assert self.compute_score is not None, "start the worker with --reward-fn"
            result = await self.call_score_fn(
                self.compute_score,
                data_source=final.data_source,
                solution_str=final.solution_str[3:],
                ground_truth=final.ground_truth,
                extra_info={},
            )
            return {"reward_score": float(result), "reward_extra_info": {"pid": os.getpid()}}
        if final.solution_str == "thread-hang":
            await asyncio.to_thread(time.sleep, 3600)
        if final.solution_str == "hang":
            await asyncio.sleep(3600)
        _act(final.solution_str)
        score = 1.0 if final.solution_str == str(final.ground_truth) else 0.0
        return {"reward_score": score, "reward_extra_info": {"pid": os.getpid()}}


def where(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    """Scores 1.0 and says where it ran: ``pid`` and ``thread`` (its name)."""
    import threading

    return {"score": 1.0, "pid": os.getpid(), "thread": threading.current_thread().name}
