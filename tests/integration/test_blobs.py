"""Records over 1 MiB travel as blobs of 1 MiB pieces (rewardq/queue/blobs.py): real Redis, in-process workers.

A large record's stream entry names its blob and holds no record bytes; the worker reads the pieces
back and scores the trajectory as if the record had come inline; every way a trajectory ends
(scored, expired, cancelled, failed) deletes its blobs, a duplicate's too. An entry naming a blob that is gone, too
large, or not a blob of its own shard gets an error result naming why, and a key it names that is
not a blob is never read or deleted.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from rewardq import RewardClient
from rewardq.queue.blobs import BLOB_CHUNK_BYTES, BLOB_TTL
from rewardq.queue.clients import Encodable
from rewardq.queue.keys import Keyspace
from tests.support.helpers import SAMPLE, output, running_workers, until
from tests.support.managers import GatedLengthManager, LengthManager
from tests.support.sync_client import SyncClient, connect

BIG = 800_000  # prompt ids: a record of ~3.2 MB, 4 pieces


def _blobs(r: SyncClient, ns: str) -> list[bytes]:
    return list(r.scan_iter(match=f"{ns}:*:blob:*", count=1000))


async def test_a_record_over_1_mib_travels_in_pieces_is_scored_and_leaves_nothing(ns: str, redis_url: str) -> None:
    r, client, ks = connect(redis_url), RewardClient.from_url(redis_url, namespace=ns), Keyspace(ns)
    # Given a trajectory of a ~3.2 MB output and a small final one, put one output at a time,
    # and a trajectory of two large outputs put whole
    keys = [
        client.put_output("big", "s", 0, output(BIG, 7), SAMPLE),
        client.put_output("big", "s", 1, output(3, 5), SAMPLE, final=True),
        *client.put_trajectory("whole", "s", [output(BIG, 4, seed=1), output(BIG, 6, seed=2)], SAMPLE),
    ]
    # Then the large records' entries name their blobs and hold no record bytes; each blob holds
    # the record in pieces of at most 1 MiB and expires unless a worker keeps it
    entries = [f for _, f in r.xrange(ks.stream(0))]
    large = [f for f in entries if b"blob" in f]
    assert len(large) == 3 and all(b"data" not in f for f in large) and b"data" in entries[1]
    for f in large:
        pieces = r.hgetall(f[b"blob"])
        assert len(pieces) == int(f[b"chunks"]) == 4 and sum(map(len, pieces.values())) == int(f[b"size"])
        assert max(map(len, pieces.values())) == BLOB_CHUNK_BYTES and 0 < r.ttl(f[b"blob"]) <= BLOB_TTL
    # When a worker scores them
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        got = await asyncio.to_thread(client.wait_rewards, keys, 60)
    # Then each trajectory was scored with all its rows (the response length of its final output),
    # and no blob and no entry is left
    assert [(x.status, x.reward_score) for x in got.values()] == [("ok", 5.0), ("ok", 5.0), ("ok", 6.0), ("ok", 6.0)]
    assert {(x.reward_extra_info or {}).get("rows") for x in got.values()} == {2}
    assert _blobs(r, ns) == [] and r.xlen(ks.stream(0)) == 0
    client.close()
    r.close()


async def test_a_trajectory_that_expires_or_is_cancelled_deletes_its_kept_blobs(ns: str, redis_url: str) -> None:
    r, client, ks = connect(redis_url), RewardClient.from_url(redis_url, namespace=ns), Keyspace(ns)
    # Given two trajectories whose large first output came and whose final one never does
    late = client.put_output("late", "s", 0, output(BIG, 3), SAMPLE)
    gone = client.put_output("gone", "s", 0, output(BIG, 3), SAMPLE)
    async with running_workers(ns, redis_url, [LengthManager(None)], incomplete_timeout=3.0):
        # When a worker keeps their records (by reference: the blob loses its TTL) and one is cancelled
        t0 = time.monotonic()
        while len([b for b in _blobs(r, ns) if r.ttl(b) == -1]) < 2 and time.monotonic() - t0 < 30:
            await asyncio.sleep(0.05)
        kept = _blobs(r, ns)
        assert len(kept) == 2 and all(r.ttl(b) == -1 for b in kept)
        assert await asyncio.to_thread(client.cancel, [gone]) == 1
        # and the other waits out incomplete_timeout
        res = await asyncio.to_thread(client.wait_rewards, [late], 30)
    # Then the expired one's key has its error, the cancelled one's its cancellation, and neither
    # trajectory's blob or entry is left
    assert res[late].status == "error" and "final output never arrived" in (res[late].error or "")
    assert client.get_rewards([gone])[gone].status == "cancelled"  # type: ignore[union-attr]
    assert _blobs(r, ns) == [] and r.xlen(ks.stream(0)) == 0
    client.close()
    r.close()


async def test_an_entry_naming_a_bad_blob_gets_an_error_naming_why_and_harms_no_key(ns: str, redis_url: str) -> None:
    r, client, ks = connect(redis_url), RewardClient.from_url(redis_url, namespace=ns), Keyspace(ns)
    victim = f"{ns}:{{s0}}:victim"
    r.set(victim, b"keep me")
    ts = f"{time.time():.6f}"
    # Given entries naming a key that is no blob, a blob that is gone, and one over max_record_bytes
    bad: dict[str, dict[Encodable, Encodable]] = {
        "foreign_s_0": {"blob": victim, "size": 7, "chunks": 1},
        "gone_s_0": {"blob": ks.blob(0, "0" * 32), "size": 2_000_000, "chunks": 2},
        "huge_s_0": {"blob": ks.blob(0, "1" * 32), "size": 10**12, "chunks": 1},
    }
    r.hset(ks.blob(0, "1" * 32), "0", b"x")
    for key, f in bad.items():
        fields: dict[Encodable, Encodable] = {"key": key, "ts": ts}
        r.xadd(ks.stream(0), {**fields, **f})
    # And a good trajectory beside them
    good = client.put_trajectory("good", "s", [output(BIG, 2), output(3, 4)], SAMPLE)
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        got = await asyncio.to_thread(client.wait_rewards, [*bad, *good], 60)
    # Then each bad key has an error result saying what is wrong with its blob
    errors = {k: got[k].error or "" for k in bad}
    assert all(got[k].status == "error" for k in bad), errors
    assert "not one a producer writes" in errors["foreign_s_0"]
    assert f"{ks.blob(0, '0' * 32)} is gone" in errors["gone_s_0"]
    assert "size 1000000000000 bytes exceeds max_record_bytes" in errors["huge_s_0"]
    # And the key that is no blob was neither read into a record nor deleted; the good trajectory
    # scored right, and the blobs named are deleted with their dead-lettered entries
    assert r.get(victim) == b"keep me"
    assert [(got[k].status, got[k].reward_score) for k in good] == [("ok", 4.0), ("ok", 4.0)]
    assert _blobs(r, ns) == [] and r.xlen(ks.stream(0)) == 0
    r.delete(victim)
    client.close()
    r.close()


@pytest.mark.parametrize("ending", ["scored", "failed", "cancelled"])
async def test_a_duplicate_that_lands_in_acks_has_its_blob_deleted_by_every_ending(
    ns: str, redis_url: str, ending: str
) -> None:
    r, client, ks = connect(redis_url), RewardClient.from_url(redis_url, namespace=ns), Keyspace(ns)
    GatedLengthManager.opened, GatedLengthManager.fail = asyncio.Event(), ending == "failed"
    big = output(BIG, 3)
    async with running_workers(ns, redis_url, [GatedLengthManager(None)]) as (w,):
        # Given a complete trajectory of a large output and a small final one, being scored
        keys = [
            client.put_output("dup", "s", 0, big, SAMPLE),
            client.put_output("dup", "s", 1, output(2, 5), SAMPLE, final=True),
        ]
        await until(lambda: w.in_flight, "the worker to score the trajectory", 30)
        # When the large output is put again (a producer's retry: the same record, a new entry and blob)
        client.put_output("dup", "s", 0, big, SAMPLE)
        assert len(_blobs(r, ns)) == 2
        # and the worker lists the duplicate's entry with the trajectory's acknowledgements
        await until(
            lambda: len((r.hget(ks.traj_key("dup_s"), "acks") or b"").split(b",")) == 2, "the duplicate listed", 30
        )
        # and the trajectory ends
        if ending == "cancelled":
            assert await asyncio.to_thread(client.cancel, keys) == 2
        GatedLengthManager.opened.set()
        got = await asyncio.to_thread(client.wait_rewards, keys, 60)
        await until(lambda: r.xlen(ks.stream(0)) == 0, "the entries deleted", 30)
    # Then it ended as asked, and neither its own blob nor the duplicate's is left, nor any entry
    status = {"scored": "ok", "failed": "error", "cancelled": "cancelled"}[ending]
    assert [x.status for x in got.values()] == [status, status]
    assert _blobs(r, ns) == [] and r.xlen(ks.stream(0)) == 0
    client.close()
    r.close()
