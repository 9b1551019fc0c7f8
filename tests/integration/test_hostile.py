"""Hostile input, end to end: every case of ``tests.support.hostile`` against a real worker.

Each case ends in exactly the state the catalogue names: every key it names holds an error result
whose reason says what was wrong, keys that had a result keep it, and each bad entry is a dead
letter of the named kind; nothing stays pending.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import pytest

from rewardq import RewardClient
from rewardq.queue.keys import MAX_KEY_BYTES, Keyspace
from tests.support.helpers import running_workers, until
from tests.support.hostile import cases
from tests.support.managers import LengthManager
from tests.support.sync_client import SyncClient


def _wait(client: RewardClient, keys: list[str], timeout: float = 30) -> dict[str, Any]:
    return client.wait_rewards(keys, timeout=timeout) if keys else {}


async def test_every_hostile_case_ends_in_its_documented_state(
    ns: str, redis_url: str, sync_redis: SyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rewardq.worker")
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    catalogue = cases("h")
    want_dead = Counter(kind for c in catalogue for kind in c.dead)
    maybe_dead = Counter(kind for c in catalogue for kind in c.maybe)
    async with running_workers(ns, redis_url, [LengthManager(None)], max_record_bytes=1024 * 1024) as (w,):
        # Given the trajectories some cases need to be finished first
        first = [k for c in catalogue if c.before for k in c.before(client)]
        before = await asyncio.to_thread(_wait, client, first)
        assert all(r.status == "ok" for r in before.values()), before
        # When every hostile input is sent
        for c in catalogue:
            c.send(sync_redis, client, ks)
        errors = {k: why for c in catalogue for k, why in c.errors.items()}
        got = await asyncio.to_thread(_wait, client, list(errors))
        await until(lambda: sync_redis.xlen(ks.dead(0)) >= sum(want_dead.values()), "the dead letters")
        await asyncio.sleep(0.5)  # anything that would still (wrongly) happen, happens now
    # Then every key a case names holds an error result naming the reason
    for key, why in errors.items():
        r = got[key]
        assert r.status == "error" and r.reward_score is None and why in r.error, (key, r.error)
        assert r.reward_extra_info == {"error": r.error}
    # And keys that had a result keep it (no crossed rewards, no overwrite by an error)
    kept = client.get_rewards([k for c in catalogue for k in c.kept])
    for c in catalogue:
        for key, reward in c.kept.items():
            kept_result = kept[key]
            assert kept_result is not None and kept_result.status == "ok" and kept_result.reward_score == reward, (
                c.name,
                key,
            )
    # And each bad entry is one dead letter of its kind (none for a plain redelivery)
    dead = [f for _, f in sync_redis.xrange(ks.dead(0))]
    kinds = Counter(f[b"kind"].decode() for f in dead)
    assert all(kinds[k] >= n for k, n in want_dead.items()), (kinds, want_dead)
    assert all(kinds[k] <= want_dead[k] + maybe_dead[k] for k in kinds), (kinds, want_dead, maybe_dead)
    # And every error key's trajectory has its dead letter; no dead letter keeps a giant key
    dead_tids = {f[b"tid"].decode() for f in dead}
    assert {k.rpartition("_")[0] for k in errors} <= dead_tids
    assert max(len(f[b"key"]) for f in dead) <= MAX_KEY_BYTES + 1
    # And a conflict is logged, not dropped silently
    conflicts = [rec.getMessage() for rec in caplog.records if "(conflict)" in rec.getMessage()]
    assert any("a different record for key hfin_s_0" in m for m in conflicts), conflicts
    # And nothing is left pending or waiting
    assert sync_redis.xpending(ks.stream(0), ks.group)["pending"] == 0
    assert sync_redis.zcard(ks.waiting(0)) == 0
    assert w.stats["dead_letters"] == len(dead)
    client.close()


async def test_inspect_of_a_refused_record_says_what_a_person_can_read(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    import time

    from rich.console import Console

    from rewardq.ops.inspect import inspect_view, render_inspect
    from rewardq.queue.codec import _packed_record

    # Given a record naming an index past int32 that nothing scores, and one that is not msgpack
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    _ = client.keyspace  # the namespace, as a producer makes it
    out = {"prompt_ids": [1, 2], "response_ids": [3, 4]}
    huge = _packed_record("u", "s", 10**12, out, {"data_source": "d"}, True, 1 << 20, None)
    sync_redis.xadd(ks.stream(0), {"key": f"u_s_{10**12}", "data": huge, "ts": f"{time.time():.6f}"})
    sync_redis.xadd(ks.stream(0), {"key": "v_s_0", "data": b"\xc1\xc1 not msgpack", "ts": f"{time.time():.6f}"})
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        await asyncio.to_thread(_wait, client, [f"u_s_{10**12}", "v_s_0"])
    client.close()
    # When `rewardq inspect` shows them
    shown = {}
    for key in (f"u_s_{10**12}", "v_s_0"):
        console = Console(width=200, record=True)
        console.print(render_inspect(inspect_view(sync_redis, ks, key), console=console))
        shown[key] = console.export_text()
    # Then neither names a Python None, an empty detail, or a scorer for what nothing scored
    for text in shown.values():
        assert "None" not in text and "()" not in text and ": )" not in text
        assert "scored by" not in text and "failed by" in text
    assert "no final output" in shown[f"u_s_{10**12}"]
