"""A failure's ledger rows agree with Redis key by key, on the real Redis with real workers: the fail
script says which keys it gave an error result and with which attempt, and the rows follow it
(docs/ledger.md): every key it wrote has a row, a key it did not write keeps its own row on top
after the ledger's dedup, and an error row outranks the rows of an attempt that died scoring it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from rewardq import RewardClient
from rewardq.consumers.metrics import WorkerMetrics
from rewardq.ledger.frames import TrajectoryFacts
from rewardq.ledger.read import read_table
from rewardq.ledger.sink import Ledger
from rewardq.ops.diagnosis import diagnose
from rewardq.ops.overview import pipeline_status
from rewardq.ops.status_view import ledger_line
from rewardq.ops.top import TopModel, render_top
from rewardq.queue.broker import StreamBroker
from rewardq.queue.codec import decode_output
from rewardq.queue.connection import connect_async
from rewardq.queue.keys import Keyspace
from rewardq.queue.results import RESULT_FIELDS, RewardResult
from tests.support.helpers import output, running_worker, until, worker_config
from tests.support.ledger_checks import assert_row_is_its_result
from tests.support.ledger_rewards import CUSTOM, FAILING
from tests.support.ledger_workload import REWARDS
from tests.support.sync_client import SyncClient

SAMPLE: dict[str, Any] = {"data_source": CUSTOM, "reward_model": {"ground_truth": "a"}}


def _put(ns: str, redis_url: str, n: int) -> tuple[RewardClient, list[str]]:
    """A producer, and the keys of trajectory ``u_s`` of ``n`` outputs it put."""
    client = RewardClient.from_url(redis_url, namespace=ns)
    return client, client.put_trajectory("u", "s", [output(3, 4, seed=i) for i in range(n)], SAMPLE)


def _agree(ledger: str, results: dict[str, RewardResult | None]) -> dict[str, dict[str, Any]]:
    """The ledger's rows after its dedup, one per key of ``results``, each saying what Redis says."""
    rows = {r["key"]: r for r in read_table(ledger).to_pylist()}
    assert set(rows) == set(results), (sorted(rows), sorted(results))
    for key, res in results.items():
        assert res is not None, key
        assert_row_is_its_result(rows[key], res)
    return rows


async def test_every_key_a_dead_letter_gives_an_error_result_has_its_row(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given a trajectory whose outputs 0, 2 and 3 (the final one) a worker with a ledger stored
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    for i in (0, 2, 3):
        client.put_output("u", "s", i, output(3, 4, seed=i), SAMPLE, final=i == 3)
    keys = [f"u_s_{i}" for i in range(4)]
    ledger = str(tmp_path / "ledger")
    async with running_worker(worker_config(ns, redis_url, reward_fn=REWARDS, ledger=ledger)):
        await until(lambda: sync_redis.hget(ks.traj(0, "u_s"), "final") == b"3", "outputs 0, 2, 3 stored", 30)
        # When its output 1 arrives and does not decode
        sync_redis.xadd(ks.stream(0), {"key": "u_s_1", "data": b"\xc1junk", "ts": f"{time.time():.6f}"})
        results = await asyncio.to_thread(client.wait_rewards, keys, 30)
    client.close()
    # Then the fail script gave every key, 0 to 3, an error result, and each has its row saying so
    assert all(r.status == "error" and r.failure_kind == "input" for r in results.values())
    rows = _agree(ledger, dict(results))
    assert all(rows[k]["committed"] is True for k in keys)
    # ... the trajectory's final row is its final key's, as the fail script knew it
    assert [k for k in keys if rows[k]["final"]] == ["u_s_3"]


async def test_an_exhausted_entry_past_a_finished_trajectory_leaves_the_rows_of_its_keys_on_top(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given a trajectory of 4 outputs scored by a worker with a ledger
    ks, ledger = Keyspace(ns), str(tmp_path / "ledger")
    client, keys = _put(ns, redis_url, 4)
    async with running_worker(worker_config(ns, redis_url, reward_fn=REWARDS, ledger=ledger)):
        scored = await asyncio.to_thread(client.wait_rewards, keys, 30)
    assert all(r.ok for r in scored.values())
    # ... and an entry naming key u_s_4, past its final output, that a dead consumer held through 9
    # deliveries (a record that kills whoever reads it)
    sync_redis.xadd(ks.stream(0), {"key": "u_s_4", "data": b"\xc1poison", "ts": f"{time.time():.6f}"})
    for _, items in sync_redis.xreadgroup(ks.group, "ghost", {ks.stream(0): ">"}):
        for eid, _fields in items:
            sync_redis.execute_command(
                "XCLAIM", ks.stream(0), ks.group, "ghost", 0, eid, "IDLE", 600_000, "RETRYCOUNT", 9
            )
    # When a worker with max_deliveries 3 reclaims and dead-letters it
    late = "u_s_4"
    cfg = worker_config(ns, redis_url, reward_fn=REWARDS, ledger=ledger, max_deliveries=3, claim_idle=0.5)
    async with running_worker(cfg):
        await until(lambda: client.get_rewards([late])[late] is not None, "the late key's error", timeout=30)
    results = client.get_rewards([*keys, late])
    client.close()
    # Then Redis keeps the scored results, the late key alone got the error
    assert all(r is not None and r.ok for r in (results[k] for k in keys))
    res = results[late]
    assert res is not None and res.status == "error" and res.attempt >= 9
    # And after the ledger's dedup every key's row is its result: the exhausted entry's rows of the
    # keys it did not write outrank nothing
    rows = _agree(ledger, results)
    assert rows[late]["committed"] is True and rows[late]["final"] is False
    assert [rows[k]["attempt"] for k in keys] == [1] * 4
    raw = read_table(ledger, dedup=False).to_pylist()
    assert all(r["committed"] is False for r in raw if r["key"] in keys and r["status"] == "error")


async def test_a_conflict_on_an_open_trajectory_outranks_the_rows_of_an_attempt_that_died(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given a trajectory of 2 outputs a worker stored, leased (attempt 1) and spooled as scored,
    # and then died before its commit: its rows are in the ledger with committed null
    ks, ledger = Keyspace(ns), str(tmp_path / "ledger")
    client, keys = _put(ns, redis_url, 2)
    r = connect_async(redis_url)
    try:
        dead = StreamBroker(r, ks, worker="dead", lease_seconds=600.0)
        await dead.ensure_groups()
        entries = await dead.read([0], 10, None)
        records = [decode_output(e.data) for e in entries]
        stored = await dead.store([(e, rec, bytes(e.data)) for e, rec in zip(entries, records)])
        assert stored[-1].kind == "complete" and stored[-1].attempts == 1
    finally:
        await r.aclose()
    spool = Ledger(
        ledger,
        worker="dead",
        spool=str(tmp_path / "dead-spool"),
        flush_interval=60.0,
        file_bytes=1 << 20,
        spool_max_bytes=1 << 30,
        flusher_process=False,
    )
    spool.open()
    row = [b"ok", b"1.0"] + [b""] * (len(RESULT_FIELDS) - 2)
    facts = TrajectoryFacts(
        records, SAMPLE, RESULT_FIELDS, [row], attempt=1, put_ts=time.time(), score_ms=1.0, provenance=""
    )
    assert spool.scored(facts, {}) is not None  # never settled: the worker died before its commit
    await spool.close(30)
    assert {r["committed"] for r in read_table(ledger, dedup=False).to_pylist()} == {None}
    # When a record conflicting with its output 0 arrives, and a worker with a ledger refuses it
    client.put_output("u", "s", 0, output(5, 6, seed=99), SAMPLE)
    async with running_worker(worker_config(ns, redis_url, reward_fn=REWARDS, ledger=ledger)):
        results = await asyncio.to_thread(client.wait_rewards, keys, 30)
    client.close()
    # Then after the ledger's dedup every key's row is its result: the conflict's error rows, not the
    # dead attempt's rows, are on top
    assert all(res.status == "error" for res in results.values())
    rows = _agree(ledger, dict(results))
    # ... the error results saying the attempt the trajectory's hash counted, as their rows do
    assert all(res.attempt == 1 for res in results.values())
    assert all(rows[k]["committed"] is True and rows[k]["worker"] != "dead" for k in keys)


async def test_a_record_naming_a_huge_index_costs_a_ledger_worker_no_more_than_its_own_key(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given entries that do not decode, naming keys far past max_outputs: one within the ledger's
    # int32 index column, one past it
    ks, keys = Keyspace(ns), [f"h_s_{10**9}", f"g_s_{10**12}"]
    client = RewardClient.from_url(redis_url, namespace=ns)
    _ = client.keyspace  # the namespace, as a producer makes it
    for key in keys:
        sync_redis.xadd(ks.stream(0), {"key": key, "data": b"\xc1junk", "ts": f"{time.time():.6f}"})
    ledger = str(tmp_path / "ledger")
    metrics = WorkerMetrics("naive")
    # When a worker with a ledger refuses them
    async with running_worker(worker_config(ns, redis_url, reward_fn=REWARDS, ledger=ledger), metrics=metrics) as w:
        results = await asyncio.to_thread(client.wait_rewards, keys, 30)
        assert w.accounting.ledger is not None
        # the count follows the fail script's reply, which the worker reads after the client may
        # have seen the results the script wrote
        for _ in range(200):
            if w.accounting.ledger.counts["refused"] or w.accounting.ledger.counts["unwritten"]:
                break
            await asyncio.sleep(0.05)
        counts = dict(w.accounting.ledger.counts)
        await w.beat()
        st = pipeline_status(sync_redis, ks)
        snap = TopModel(sync_redis, ks, redis_url).refresh()
    client.close()
    # Then each key has its error result at once (no row is made per index below it)
    assert all(r.status == "error" and r.failure_kind == "input" for r in results.values())
    # And the first has its row; the second, whose index no int32 holds, none by design: counted as
    # refused, not as a trajectory the destination failed to keep
    _agree(ledger, {keys[0]: results[keys[0]]})
    assert (counts["refused"], counts["unwritten"]) == (1, 0)
    assert metrics.registry.get_sample_value("rewardq_ledger_refused_total") == 1
    # ... so status says so calmly, with no diagnosis blaming the destination
    assert (st["ledger"]["refused"], st["ledger"]["unwritten"]) == (1, 0)
    assert "1 key with no row by design" in ledger_line(st["ledger"])
    assert not [d for d in diagnose(st) if "ledger" in str(d["message"])]
    # ... and so does top
    console = Console(width=200, record=True)
    console.print(render_top(snap, 200))
    assert "1 key with no row by design" in console.export_text()


async def test_a_trajectory_id_used_again_fails_without_outranking_the_results_it_kept(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given a trajectory of 2 outputs scored by a worker with a ledger, whose hash then expired
    # (its results are still there)
    ks, ledger = Keyspace(ns), str(tmp_path / "ledger")
    client, first = _put(ns, redis_url, 2)
    cfg = worker_config(ns, redis_url, reward_fn=REWARDS, ledger=ledger)
    async with running_worker(cfg):
        await asyncio.to_thread(client.wait_rewards, first, 30)
        sync_redis.delete(ks.traj(0, "u_s"))
        # When the producer puts the same trajectory id again with 4 outputs, whose scoring raises
        outs = [output(3, 4, seed=10 + i) for i in range(4)]
        keys = client.put_trajectory("u", "s", outs, {**SAMPLE, "data_source": FAILING})
        await until(lambda: all(client.get_rewards(keys).values()), "four results", timeout=30)
    results = client.get_rewards(keys)
    client.close()
    # Then the first two keys keep their scores, the new two have the error
    assert [r is not None and r.status for r in results.values()] == ["ok", "ok", "error", "error"]
    # And after the ledger's dedup every key's row is its result
    rows = _agree(ledger, results)
    assert [rows[k]["committed"] for k in keys] == [True] * 4


async def test_an_undecodable_entry_fails_its_trajectory_with_the_entries_read_beside_it(
    ns: str, redis_url: str, tmp_path: Path, sync_redis: SyncClient
) -> None:
    # Given trajectories of 3 outputs (the last final) of which one entry, raw, does not decode:
    # each index in turn, sent before or after the two valid ones; and between them a valid
    # trajectory of another uid, all queued before any worker reads
    ks, ledger = Keyspace(ns), str(tmp_path / "ledger")
    client = RewardClient.from_url(redis_url, namespace=ns)
    _ = client.keyspace  # the namespace, as a producer makes it
    bad: dict[str, str] = {}
    for n, (broken, first) in enumerate((b, f) for b in range(3) for f in (True, False)):
        uid = f"split{n}"
        key = f"{uid}_x_{broken}"

        def raw(key: str = key) -> None:
            sync_redis.xadd(ks.stream(0), {"key": key, "data": b"\xc1\xc1 not msgpack", "ts": f"{time.time():.6f}"})

        if first:
            raw()
        for i in (i for i in range(3) if i != broken):
            client.put_output(uid, "x", i, output(3, 4, seed=i), SAMPLE, final=i == 2)
        if not first:
            raw()
        bad[f"{uid}_x"] = key
        client.put_trajectory(f"good{n}", "g", [output(3, 4, seed=9), output(3, 4, seed=8)], SAMPLE)
    failed = [f"{tid}_{i}" for tid in bad for i in range(3)]
    good = [f"good{n}_g_{i}" for n in range(len(bad)) for i in range(2)]
    # When one worker with a ledger reads them
    async with running_worker(worker_config(ns, redis_url, reward_fn=REWARDS, ledger=ledger)):
        results = await asyncio.to_thread(client.wait_rewards, failed + good, 30)
        await until(lambda: not sync_redis.xpending(ks.stream(0), ks.group)["pending"], "every entry acked", 10)
    client.close()
    # Then each such trajectory has an error result on every key, the other uid's are scored
    assert all(results[k].status == "error" and results[k].failure_kind == "input" for k in failed)
    assert all(results[k].ok for k in good)
    # ... with one dead letter each, `invalid`, for its undecodable entry, and none for the others
    dead = [fields for _, fields in sync_redis.xrange(ks.dead(0))]
    assert sorted((d[b"kind"], d[b"key"]) for d in dead) == sorted((b"invalid", k.encode()) for k in bad.values())
    # ... and a ledger row per key saying so, keeping the trajectory's data source
    rows = _agree(ledger, dict(results))
    assert all(rows[k]["data_source"] == CUSTOM and rows[k]["committed"] is True for k in failed)
    assert [k for k in failed if rows[k]["final"]] == [f"{tid}_2" for tid in bad]
