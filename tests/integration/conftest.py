"""Fixtures of the integration tests of the LLM judge (``genrm``): the stand-in judge server, started
once per test module and reset for each test, and a builder of set-up ``genrm`` managers on the
real Redis, closed after the test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from rewardq.reward.base import ManagerContext
from rewardq.reward.managers.genrm import GenRMRewardManager
from tests.support.judge_standin import JudgeStandin
from tests.support.managers import MakeManager, set_up_managers
from tests.support.records import TOK


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JudgeStandin]:
    s = JudgeStandin(tmp_path_factory.mktemp("judge"))
    yield s
    s.stop()


@pytest.fixture
def judge(standin: JudgeStandin) -> JudgeStandin:
    standin.control(reset=True)
    return standin


@pytest.fixture
async def genrm(judge: JudgeStandin, redis_url: str, ns: str) -> AsyncIterator[MakeManager[GenRMRewardManager]]:
    def build(*, redis: bool = True, worker: str = "w0", **options: Any) -> GenRMRewardManager:
        ctx = ManagerContext(redis_url=redis_url if redis else None, namespace=ns, worker_name=worker, result_ttl=600)
        options.setdefault("backoff_base", 0.05)
        return GenRMRewardManager(TOK, context=ctx, base_url=judge.base_url, model="judge-model", **options)

    async with set_up_managers(build) as make:
        yield make
