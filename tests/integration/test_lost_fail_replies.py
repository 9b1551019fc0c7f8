"""Ending scripts sent again after their reply was lost answer as their first run did.

The retry policy (:mod:`rewardq.queue.retry`) sends a script call again when its try failed with a
connection error within ``SCRIPT_RESEND_WINDOW``; the reply may have been lost after the script
ran. A second run of ``fail`` would find the trajectory ended and write nothing, and one of
``expire`` would find nothing due: the worker's ledger rows would then be settled by a reply that
says nothing was written, while Redis holds the first run's error results. Each call carries a
nonce and the scripts keep their reply under it (:func:`rewardq.queue.endings.call_nonce`): these
tests lose the first reply with a real Redis behind a proxy and check what the worker gets back,
what Redis holds, and the ledger rows after its dedup.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from rewardq import RewardClient
from rewardq.consumers.accounting import Accounting
from rewardq.ledger.read import read_table
from rewardq.queue import scripts
from rewardq.queue.broker import StreamBroker
from rewardq.queue.connection import connect_async
from rewardq.queue.endings import Failed
from rewardq.queue.keys import Keyspace
from rewardq.queue.states import FailureKind
from rewardq.reward.provenance import ProvenanceBook
from tests.support.ledger_checks import assert_row_is_its_result
from tests.support.ledger_facts import make_ledger
from tests.support.redis_server import RedisServer
from tests.support.reply_loss import ReplyLossProxy


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _proxy(server: RedisServer, name: str) -> ReplyLossProxy:
    """A proxy losing the first reply of every distinct call of script ``name`` (loaded first, so
    the lost reply is the script's own)."""
    r = server.client()
    try:
        sha = r.execute_command("SCRIPT", "LOAD", scripts.source(name, True))
    finally:
        r.close()
    return ReplyLossProxy(("127.0.0.1", server.port), marker=sha.encode() if isinstance(sha, str) else bytes(sha))


async def _publish(_digest: str, _blob: str) -> None:
    raise AssertionError("a dead letter's rows name no provenance")


@pytest.mark.parametrize("done", [False, True], ids=["open", "finished"])
async def test_a_fail_sent_again_after_a_lost_reply_answers_and_settles_as_it_ran(
    server: RedisServer, tmp_path: Path, done: bool
) -> None:
    ns = f"lf-{uuid.uuid4().hex[:6]}"
    ks = Keyspace(ns)
    direct = server.client()
    # Given trajectory u_s whose outputs 0 and 1 (final) Redis knows, collecting on its first
    # attempt; or finished and scored, with a late entry naming key 2 past it
    traj = ks.traj(0, "u_s")
    if done:
        direct.hset(traj, mapping={"state": "done", "final": 1, "n": 2, "attempts": 1})
        for i in (0, 1):
            direct.hset(f"{ks.reward_prefix(0)}u_s_{i}", mapping={"status": "ok", "reward_score": "1.0"})
    else:
        direct.hset(traj, mapping={"state": "collecting", "hi": 1, "final": 1, "attempts": 1})
    index, expected = (2, Failed([2], 0, 1)) if done else (1, Failed([0, 1], 1, 1))
    ledger = make_ledger(tmp_path)
    # the book is never asked: a dead letter's rows name no provenance
    accounting = Accounting(cast(ProvenanceBook, None), _publish, ledger)
    rows = accounting.before_dead_letter(
        "u",
        "s",
        index,
        None,
        "boom",
        FailureKind.INPUT,
        attempt=expected.attempt,
        put_ts=time.time(),
        own_key=done,
        max_outputs=8,
    )
    assert rows is not None
    with _proxy(server, "fail") as proxy:
        client = connect_async(proxy.url())
        try:
            broker = StreamBroker(client, ks, worker="w", max_outputs=8)
            # When the dead letter's fail script runs and its reply is lost (the policy sends it again)
            failed = await broker.fail(
                0,
                "u_s",
                "boom",
                index=index,
                kind=FailureKind.INPUT,
                attempt=expected.attempt,
                dead={"reason": "boom"},
            )
            assert proxy.lost == 1, "no reply was lost: the test did not test anything"
        finally:
            await client.aclose()
    # Then the worker got the first run's reply, and Redis holds one dead letter
    assert failed == expected
    assert direct.xlen(ks.dead(0)) == 1
    # And the rows settle as written: after the ledger's dedup each key's row is its result
    assert rows is not None
    rows.settle(failed)
    await ledger.close(30)
    producer = RewardClient.from_url(server.url, namespace=ns)
    results = producer.get_rewards([f"u_s_{i}" for i in range(3)])
    producer.close()
    table = {r["key"]: r for r in read_table(str(tmp_path / "ledger")).to_pylist()}
    written = [f"u_s_{i}" for i in expected.indexes]
    assert sorted(table) == written
    for key in written:
        res = results[key]
        assert res is not None and res.status == "error"
        assert_row_is_its_result(table[key], res)
        assert table[key]["committed"] is True
    direct.delete(*direct.keys(f"{ns}:*"))
    direct.close()


async def test_an_expire_sent_again_after_a_lost_reply_returns_the_trajectories_it_ended(
    server: RedisServer,
) -> None:
    ns = f"le-{uuid.uuid4().hex[:6]}"
    ks = Keyspace(ns)
    direct = server.client()
    # Given trajectory u_s, collecting outputs 0 (stored) and 1 (never came), past its timeout
    direct.hset(ks.traj(0, "u_s"), mapping={"state": "collecting", "hi": 1, "o:0": b"record-0", "bytes": 8})
    direct.zadd(ks.waiting(0), {"u_s": time.time() - 5})
    with _proxy(server, "expire") as proxy:
        client = connect_async(proxy.url())
        try:
            broker = StreamBroker(client, ks, worker="w", max_outputs=8)
            # When the expire script ends it and its reply is lost (the policy sends it again)
            ended = await broker.expire_incomplete(0, records_bytes=1 << 20)
            assert proxy.lost == 1, "no reply was lost: the test did not test anything"
        finally:
            await client.aclose()
    # Then the worker got the trajectory the first run ended, with the records it had
    assert [(e.tid, e.keys, e.records, e.wrote) for e in ended] == [("u_s", 2, [b"record-0", None], [0, 1])]
    assert "incomplete trajectory" in ended[0].reason and ended[0].latency_ms is not None
    # ... Redis holds its error results and one dead letter, and the kept reply expires
    assert [direct.hget(f"{ks.reward_prefix(0)}u_s_{i}", "status") for i in (0, 1)] == [b"error", b"error"]
    assert direct.xlen(ks.dead(0)) == 1
    kept = direct.keys(f"{ks.waiting(0)}:expired:*")
    assert kept == [ks.expired_reply(0, "w").encode()] and 0 < direct.pttl(kept[0]) <= 60_000
    # ... one per worker: its next call (a new nonce) that ends nothing runs and deletes it
    client = connect_async(server.url)
    try:
        again = StreamBroker(client, ks, worker="w", max_outputs=8)
        assert await again.expire_incomplete(0, records_bytes=1 << 20) == []
    finally:
        await client.aclose()
    assert not direct.keys(f"{ks.waiting(0)}:expired:*")
    direct.delete(*direct.keys(f"{ns}:*"))
    direct.close()
