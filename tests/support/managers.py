"""Deterministic reward managers for tests that run real worker processes.

Loaded by workers as ``--manager tests.support.managers:EchoManager`` (the operator's
configuration naming the code, as in production). Every output key gets its own reward,
computed from that output's own response ids by :func:`expected_reward`, so a test can
check each key's value and would notice results written to the wrong key.

:func:`set_up_managers` is the fixture body of tests that build managers in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tensordict import TensorDict

from rewardq.reward.base import RewardManager
from rewardq.reward.rows import non_tensor, valid_response_ids

M = TypeVar("M", bound=RewardManager)

MakeManager = Callable[..., Awaitable[M]]
"""What :func:`set_up_managers` yields: ``await make(*args, **kw)`` is a manager of type ``M``, set up."""


@contextlib.asynccontextmanager
async def set_up_managers(build: Callable[..., M]) -> AsyncIterator[MakeManager[M]]:
    """Yields ``make(*args, **kw)``: a manager from ``build(*args, **kw)``, set up; every manager
    made is closed on exit."""
    made: list[M] = []

    async def make(*args: Any, **kw: Any) -> M:
        m = build(*args, **kw)
        made.append(m)
        await m.setup()
        return m

    yield make
    for m in made:
        await m.close()


def expected_reward(response_ids: Sequence[int] | np.ndarray) -> float:
    """The reward :class:`EchoManager` gives an output with these response ids."""
    ids = np.asarray(response_ids, dtype=np.int64)
    return float(int(ids.sum()) % 100_003) + len(ids) / 1000.0


class EchoManager(RewardManager):
    """One reward per output, from its response ids; optionally slow, optionally announcing itself.

    Args:
        sleep: seconds each trajectory takes to score (``asyncio.sleep``: other
            trajectories proceed meanwhile).
        jitter: extra random seconds, up to this much, per trajectory.
        mark_dir: when set, a file ``<mark_dir>/<pid>-<random>`` is created as scoring starts, so a
            test knows the worker is "while scoring" before it kills it.
    """

    name = "test-echo"

    def __init__(
        self,
        tokenizer: Any = None,
        compute_score: Any = None,
        *,
        context: Any = None,
        sleep: float = 0.0,
        jitter: float = 0.0,
        mark_dir: str | None = None,
    ) -> None:
        super().__init__(tokenizer, compute_score, context=context)
        self.sleep = float(sleep)
        self.jitter = float(jitter)
        self.mark_dir = Path(mark_dir) if mark_dir else None

    async def run_single(self, data: Any) -> list[dict[str, Any]]:
        n = int(data.batch_size[0])
        if self.mark_dir is not None:
            (self.mark_dir / f"{os.getpid()}-{os.urandom(4).hex()}").write_text(str(n))
        delay = self.sleep + (random.random() * self.jitter if self.jitter else 0.0)
        if delay:
            await asyncio.sleep(delay)
        out = []
        for i in range(n):
            ids = valid_response_ids(data[i : i + 1]).tolist()
            out.append({"reward_score": expected_reward(ids), "reward_extra_info": {"i": i, "n": n}})
        return out


class LengthManager(RewardManager):
    """Test manager: reward = valid response length of the final row; records the batch."""

    name = "test-length"
    calls: list[TensorDict] = []

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        type(self).calls.append(data)
        last = data[-1:]
        ids = valid_response_ids(last)
        gt = (non_tensor(last, "reward_model") or {}).get("ground_truth")
        return {"reward_score": float(len(ids)), "reward_extra_info": {"rows": int(data.batch_size[0]), "gt": gt}}


class GatedLengthManager(LengthManager):
    """LengthManager that scores only once the class's ``opened`` event is set (give it a fresh
    ``asyncio.Event`` per test); with ``fail`` it raises instead (kind ``scorer``)."""

    opened: asyncio.Event
    fail = False

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        await type(self).opened.wait()
        if type(self).fail:
            raise ValueError("the reward function has a bug")
        return await super().run_single(data)


class FailingManager(RewardManager):
    """Fails as the sample's ground truth says, else scores 1.0: each failure of a kind its own way.

    ``raise`` raises ValueError (kind ``scorer``); ``hang`` sleeps an hour (past ``score_timeout``:
    ``timeout``); ``transient`` raises :class:`~rewardq.errors.TransientError` with
    ``Retry-After: 0.2`` (``transient``); ``config`` a judge refusing the key (``config``);
    ``verl-extra`` a ScoringError carrying verl's extra info (``{"acc": 0.0}``).
    """

    name = "test-failing"

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        from rewardq.errors import FleetConfigError, ScoringError, TransientError

        how = (non_tensor(data[-1:], "reward_model") or {}).get("ground_truth")
        if how == "raise":
            raise ValueError("the reward function has a bug")
        if how == "hang":
            await asyncio.sleep(3600)
        if how == "transient":
            raise TransientError("the judge answered HTTP 503", retry_after=0.2)
        if how == "config":
            raise FleetConfigError("the judge refused the API key with HTTP 401")
        if how == "verl-extra":
            raise ScoringError("the judge's answer had no score", extra_info={"acc": 0.0, "judge_votes": 0})
        return {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}


class OutageManager(RewardManager):
    """A judge that is down until ``OutageManager.down_until`` (wall time), then scores 1.0.

    While down, a trajectory of data source ``judge`` raises :class:`~rewardq.errors.TransientError`
    with ``retry_after`` = ``OutageManager.retry_after`` (None: the server says nothing); one of
    any other data source scores 0.5 at once. Every call is logged in ``calls`` as
    ``(time, uid, ok)``.
    """

    name = "test-outage"
    down_until = 0.0
    retry_after: float | None = 0.3
    calls: list[tuple[float, str, bool]] = []

    async def run_single(self, data: TensorDict) -> dict[str, Any]:
        import time

        from rewardq.errors import TransientError

        cls = type(self)
        last = data[-1:]
        uid = str(non_tensor(last, "extra_info").get("uid", ""))
        if non_tensor(last, "data_source") != "judge":
            return {"reward_score": 0.5, "reward_extra_info": {"acc": 0.5}}
        now = time.time()
        up = now >= cls.down_until
        cls.calls.append((now, uid, up))
        if not up:
            raise TransientError("the judge answered HTTP 503", retry_after=cls.retry_after)
        return {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}
