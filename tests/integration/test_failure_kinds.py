"""Each way scoring fails ends in an error result that says its kind: real Redis, a real worker.

Given one worker and trajectories that fail in every way a worker meets (an unknown data source,
a reward function that raises, a scorer past ``score_timeout``, a judge refusing the key, a
record that does not decode, outputs that never arrive), each key reads back through
``RewardClient`` with the failure kind of its cause, and the healthy trajectories beside them are
scored as if nothing happened.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rewardq import FailureKind, RewardClient
from rewardq.ops.deadletters.stream import DeadLetters
from rewardq.queue.keys import Keyspace
from rewardq.reward.managers.naive import NaiveRewardManager
from tests.support.helpers import output, running_workers, until
from tests.support.managers import FailingManager
from tests.support.records import TOK
from tests.support.sync_client import connect


def sample(ground_truth: str, data_source: str = "test") -> dict[str, Any]:
    return {"data_source": data_source, "reward_model": {"ground_truth": ground_truth}, "extra_info": {}}


async def test_each_failure_reads_back_with_its_kind_and_healthy_trajectories_are_scored(
    ns: str, redis_url: str
) -> None:
    # Given trajectories that fail in four ways, beside healthy ones
    client = RewardClient.from_url(redis_url, namespace=ns)
    cases = {"raise": FailureKind.SCORER, "hang": FailureKind.TIMEOUT, "config": FailureKind.CONFIG}
    keys = {how: client.put_trajectory(how, "s", [output(2, 3), output(2, 4)], sample(how)) for how in cases}
    extra = client.put_trajectory("extra", "s", [output(2, 3)], sample("verl-extra"))
    healthy = [client.put_trajectory(f"ok{i}", "s", [output(2, 3, seed=i)], sample("42")) for i in range(4)]

    # When one worker scores them (score_timeout short enough for the hanging one)
    async with running_workers(ns, redis_url, [FailingManager(None)], score_timeout=1.0):
        every = [k for ks in (*keys.values(), extra, *healthy) for k in ks]
        results = await asyncio.to_thread(client.wait_rewards, every, 20)

    # Then every key of a failed trajectory is an error of its cause's kind, never a reward
    for how, kind in cases.items():
        for key in keys[how]:
            r = results[key]
            assert r.status == "error" and r.reward_score is None and r.failure_kind is kind, (how, r)
            assert r.reward_extra_info == {"error": r.error}
    assert "ValueError: the reward function has a bug" in (results[keys["raise"][0]].error or "")
    assert "ScoringTimeout: scoring timed out after 1s (score_timeout)" in (results[keys["hang"][0]].error or "")
    # a failure that carries verl's extra info keeps it beside the reason
    (e,) = (results[k] for k in extra)
    assert e.failure_kind is FailureKind.SCORER
    assert e.reward_extra_info == {"acc": 0.0, "judge_votes": 0, "error": e.error}
    # and the healthy ones are rewards, with no failure kind
    assert all(
        results[k].ok and results[k].reward_score == 1.0 and results[k].failure_kind is None for h in healthy for k in h
    )
    # the dead letters say the same kinds
    rc = connect(redis_url)
    try:
        kinds = {
            d.fields["tid"].decode(): d.fields["failure_kind"].decode() for d in DeadLetters(rc, Keyspace(ns)).iter()
        }
    finally:
        rc.close()
    assert kinds == {"raise_s": "scorer", "hang_s": "timeout", "config_s": "config", "extra_s": "scorer"}
    client.close()


async def test_an_unknown_data_source_is_a_config_failure(ns: str, redis_url: str) -> None:
    # Given the default scorer, which knows no data source "no-such-source", and one it knows
    client = RewardClient.from_url(redis_url, namespace=ns)
    unknown = client.put_trajectory("u", "s", [output(2, 3)], sample("42", data_source="no-such-source"))
    gsm8k = client.put_trajectory(
        "g",
        "s",
        [{"prompt_ids": TOK.encode("Q?"), "response_ids": TOK.encode("so #### 42")}],
        sample("42", "openai/gsm8k"),
    )
    # When a worker with the naive manager scores them
    async with running_workers(ns, redis_url, [NaiveRewardManager(TOK)], tokenizer=TOK):
        results = await asyncio.to_thread(client.wait_rewards, unknown + gsm8k, 30)
    # Then the unknown one is a config failure naming the data source; the other is scored
    (u,) = (results[k] for k in unknown)
    assert u.status == "error" and u.failure_kind is FailureKind.CONFIG and "no-such-source" in (u.error or "")
    assert results[gsm8k[0]].ok and results[gsm8k[0]].reward_score == 1.0
    client.close()


async def test_bad_input_is_an_input_failure(ns: str, redis_url: str) -> None:
    # Given a record that does not decode and a trajectory whose outputs never all arrive
    client = RewardClient.from_url(redis_url, namespace=ns)
    r = connect(redis_url)
    ks = Keyspace(ns)
    r.xadd(ks.stream(0), {"key": "junk_s_0", "data": b"\x93garbage"})
    client.put_output("late", "s", 1, output(2, 6), sample("42"), final=True)
    # When a worker reads them
    async with running_workers(ns, redis_url, [FailingManager(None)], incomplete_timeout=0.5):
        results = await asyncio.to_thread(client.wait_rewards, ["junk_s_0", "late_s_0", "late_s_1"], 15)
        await until(lambda: r.xlen(ks.dead(0)) == 2, "both dead letters", 5.0)
    # Then every key is an error of kind input, and so is each dead letter
    assert {k: (x.status, x.failure_kind) for k, x in results.items()} == {
        k: ("error", FailureKind.INPUT) for k in results
    }
    assert "missing output indices 0 of 0..1" in (results["late_s_0"].error or "")
    dead = {d.kind: d.fields["failure_kind"].decode() for d in DeadLetters(r, ks).iter()}
    assert dead == {"invalid": "input", "incomplete": "input"}
    r.close()
    client.close()
