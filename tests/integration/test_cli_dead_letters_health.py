"""``rewardq dead-letters list | show | retry | purge`` and ``rewardq health`` against the real Redis.

Commands run in-process (``tests.support.cli_ops.rq``), ``purge``'s question also as a real process
on a terminal. Workers run in-process (``tests.support.helpers.running_workers``).
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import socket
import time

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from tests.support.cli_ops import arq, check_types, on_a_terminal, read_until, rq
from tests.support.cli_procs import Procs
from tests.support.helpers import FlakyJudge, fail_a_trajectory_and_a_junk_entry, running_workers
from tests.support.managers import LengthManager
from tests.support.sync_client import SyncClient

# -- dead letters ------------------------------------------------------------------------------

DL_SPEC = {
    "ref": str,
    "kind": str,
    "time": float,
    "tid": str,
    "key": str,
    "deliveries": int,
    "worker": str,
    "reason": str,
    "data_bytes": int,
}


async def test_dead_letters_list_show_retry_after_a_fix_and_purge(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    r, ks = sync_redis, Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    base = ("--redis-url", redis_url, "--namespace", ns)
    keys, first = await fail_a_trajectory_and_a_junk_entry(ns, redis_url, r, client, "junk_s_0")
    assert all(x.status == "error" for x in first.values())

    # list: JSON schema, --kind, and the table
    code, out, err = rq("dead-letters", "list", *base, "--json")
    assert code == 0, err
    listed = json.loads(out)
    assert listed["total"] == 2 and listed["shown"] == 2
    for d in listed["dead_letters"]:
        check_types(d, DL_SPEC)
    assert {d["kind"] for d in listed["dead_letters"]} == {"scoring", "invalid"}
    code, out, _ = rq("dead-letters", "list", *base, "--kind", "scoring", "--json")
    (scoring,) = json.loads(out)["dead_letters"]
    assert scoring["tid"] == "flaky_s" and "503" in scoring["reason"] and scoring["deliveries"] == 1
    code, out, _ = rq("dead-letters", "list", *base, "--limit", "1")
    assert code == 0 and "1 shown of 2" in out
    code, out, _ = rq("dead-letters", "list", *base)
    assert scoring["ref"] in out and "invalid" in out and "junk_s_0" in out
    code, _, err = rq("dead-letters", "list", *base, "--kind", "bogus")
    assert code == 2 and "bogus" in err

    # show: reason, traceback, the record's identity, the raw size
    code, out, _ = rq("dead-letters", "show", scoring["ref"], *base, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["record"] == {"uid": "flaky", "session_id": "s", "index": 2}
    assert "RuntimeError: judge endpoint returned 503" in shown["traceback"] and shown["data_bytes"] > 20
    code, out, _ = rq("dead-letters", "show", scoring["ref"], *base)
    assert "traceback:" in out and "uid flaky, session s, output 2; raw" in out and "bytes" in out
    assert f"rewardq dead-letters retry {scoring['ref']}" in out
    code, out, err = rq("dead-letters", "show", "0:1-0", *base)
    assert code == 1 and "no dead letter '0:1-0'" in err and "dead-letters list" in err

    # retry: flag errors change nothing; after the fix the trajectory scores
    for bad in ((), (scoring["ref"], "--all")):
        code, _, err = rq("dead-letters", "retry", *bad, *base)
        assert code == 2 and "--all" in err
    code, _, err = rq("dead-letters", "retry", scoring["ref"], "0:1-0", *base)
    assert code == 1 and "'0:1-0'" in err and "nothing was changed" in err and r.xlen(ks.dead(0)) == 2
    FlakyJudge.broken = False
    code, out, err = rq("dead-letters", "retry", scoring["ref"], *base)
    assert code == 0, err
    assert "reopened flaky_s (3 results cleared); 3 kept record(s) restored; record re-queued" in out
    assert "retried 1 dead letter" in out
    assert "no live worker" in err
    assert client.get_rewards(keys) == {k: None for k in keys}
    async with running_workers(ns, redis_url, [FlakyJudge(None)]):
        second = await asyncio.to_thread(client.wait_rewards, keys, 10)
    assert [x.reward_score for x in second.values()] == [0.5, 0.5, 0.5]
    assert [x.reward_extra_info for x in second.values()] == [{"judge": "ok"}] * 3

    # purge: refuses without --yes when there is no terminal; --older-than filters; --yes deletes
    code, _, err = rq("dead-letters", "purge", "--all", "--kind", "invalid", *base)
    assert code == 2 and "refusing to purge 1 dead letter(s) of kind invalid" in err and "--yes" in err
    assert r.xlen(ks.dead(0)) == 1
    code, out, _ = rq("dead-letters", "purge", "--all", "--older-than", "3600", "--yes", *base)
    assert code == 0 and "nothing to do" in out and r.xlen(ks.dead(0)) == 1
    (invalid,) = [d["ref"] for d in listed["dead_letters"] if d["kind"] == "invalid"]
    code, out, _ = rq("dead-letters", "purge", "--all", "--kind", "invalid", "--yes", "--json", *base)
    assert code == 0 and json.loads(out) == {"namespace": ns, "purged": 1, "refs": [invalid]}
    assert r.xlen(ks.dead(0)) == 0
    client.close()


def test_dead_letters_retry_many_shows_progress_and_purge_asks_on_a_terminal(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    r, ks = sync_redis, Keyspace(ns)
    base = ("--redis-url", redis_url, "--namespace", ns)
    _ = RewardClient.from_url(redis_url, namespace=ns).keyspace  # <ns>:meta
    for i in range(4):
        r.xadd(
            ks.dead(0),
            {
                "kind": "invalid" if i < 3 else "scoring",
                "reason": f"bad {i}",
                "key": f"j{i}_s_0",
                "data": b"raw",
                "time": f"{time.time():.6f}",
                "deliveries": "1",
                "worker": "gone",
            },
        )
    before = r.xlen(ks.stream(0))
    code, out, err = rq("dead-letters", "retry", "--all", "--kind", "invalid", *base)
    assert code == 0, err
    assert out.count("record re-queued") == 3 and "retried 3 dead letter(s)" in out
    assert "retrying dead letters" in err and "3/3" in err
    assert r.xlen(ks.stream(0)) == before + 3 and r.xlen(ks.dead(0)) == 1
    code, out, _ = rq("dead-letters", "retry", "--all", "--kind", "exhausted", "--json", *base)
    assert code == 0 and json.loads(out)["retried"] == []

    # purge on a terminal asks first: "n" keeps the dead letter (exit 1), "y" deletes it
    (ref,) = [f"0:{eid.decode()}" for eid, _ in r.xrange(ks.dead(0))]
    for answer, want_code in ((b"n\n", 1), (b"y\n", 0)):
        with on_a_terminal(["dead-letters", "purge", ref, *base]) as (proc, master):
            read_until(master, "[y/N]", 20, send=answer)
            assert proc.wait(20) == want_code
            rest = read_until(master, "deleted" if answer == b"n\n" else "purged", 5)
        assert r.xlen(ks.dead(0)) == (1 if answer == b"n\n" else 0), rest


# -- health ------------------------------------------------------------------------------------


async def test_health_exit_codes(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    r, ks = sync_redis, Keyspace(ns)
    base = ("--redis-url", redis_url, "--namespace", ns)
    # No namespace yet, then a namespace without a group or worker: unhealthy (1), saying why
    code, _, err = rq("health", *base)
    assert code == 1 and f"namespace '{ns}' does not exist" in err
    _ = RewardClient.from_url(redis_url, namespace=ns).keyspace
    code, _, err = rq("health", *base)
    assert code == 1 and "consumer group 'rewardq-workers' is missing on shard(s) 0" in err
    assert "no fresh heartbeat" in err and "Traceback" not in err
    # A live worker on this host: healthy (0), found by host, by --name, through the environment doors
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        await asyncio.sleep(0.3)
        ok = await arq("health", *base)
        named = await arq("health", *base, "--name", "w0", "--json")
        other = await arq("health", *base, "--name", "w9")
        env = await arq("health", env={"REWARDQ_REDIS_URL": redis_url, "REWARDQ_NAMESPACE": ns})
        anyhost = await arq("health", *base, "--any-host")
    assert ok[0] == 0 and "healthy: Redis at" in ok[1] and "w0 (" in ok[1] and ok[2] == ""
    assert named[0] == 0 and env[0] == 0 and anyhost[0] == 0
    report = json.loads(named[1])
    check_types(
        report,
        {
            "healthy": bool,
            "namespace": str,
            "host": str,
            "target": str,
            "checks": list,
            "workers": list,
            "stale": list,
            "others": int,
            "message": str,
        },
    )
    assert report["healthy"] is True and [c["name"] for c in report["checks"]] == ["redis", "group", "heartbeat"]
    assert all(c["ok"] is True and isinstance(c["detail"], str) for c in report["checks"])
    assert report["workers"][0]["name"] == "w0" and report["workers"][0]["age_s"] < 10
    assert other[0] == 1 and "from worker 'w9'" in other[2] and "1 live worker(s) elsewhere" in other[2]
    # The worker stopped (it unregistered); a worker of this host whose heartbeat is a minute old is stale
    assert rq("health", *base)[0] == 1
    r.zadd(ks.workers, {"old": time.time() - 60})
    r.hset(ks.worker("old"), mapping={"host": socket.gethostname(), "pid": "1"})
    code, _, err = rq("health", *base)
    assert code == 1 and "stale: old (last beat 60s ago)" in err
    code, out, _ = rq("health", *base, "--max-age", "120", "--json")
    assert code == 0 and json.loads(out)["workers"][0]["name"] == "old"
    # A fresh score in the workers set but no heartbeat hash (it expired: the process died) is not alive
    r.zadd(ks.workers, {"gone": time.time()})
    code, out, _ = rq("health", *base, "--any-host", "--json")
    report = json.loads(out)
    assert code == 1 and sorted(w["name"] for w in report["stale"]) == ["gone", "old"] and report["others"] == 0
    # A fresh heartbeat but no consumer group (e.g. Redis restarted without persistence): unhealthy
    r.xgroup_destroy(ks.stream(0), ks.group)
    code, out, _ = rq("health", *base, "--max-age", "120", "--json")
    report = json.loads(out)
    assert code == 1 and report["healthy"] is False
    assert [c["name"] for c in report["checks"] if not c["ok"]] == ["group"]
    # Redis unreachable: 3, without the password; contradictory flags: 2
    code, _, err = rq("health", "--redis-url", "redis://:hunter2@127.0.0.1:1/0")
    assert code == 3 and "redis://:***@127.0.0.1:1/0" in err and "hunter2" not in err
    code, _, err = rq("health", *base, "--name", "x", "--any-host")
    assert code == 2 and "--any-host" in err


# -- the pieces --------------------------------------------------------------------------------


async def test_dead_letters_hints_run_as_printed(ns: str, redis_url: str, sync_redis: SyncClient, procs: Procs) -> None:
    """The commands ``list`` and ``show`` print name the namespace (and the Redis, given here in
    another spelling than the default): each, run as printed, acts on these dead letters."""
    r, ks = sync_redis, Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    await fail_a_trajectory_and_a_junk_entry(ns, redis_url, r, client, "junk_h_0")
    url = redis_url.replace("127.0.0.1", "localhost")  # not the default spelling: the hints must carry it
    base = ("--redis-url", url, "--namespace", ns)

    def hints(out: str) -> dict[str, list[str]]:
        """The printed commands by label, their shell line continuations joined (as a shell does)."""
        found = {}
        for line in re.sub(r" \\\n\s*", " ", out).splitlines():
            what, sep, command = line.partition(": rewardq ")
            if sep:
                found[what.strip()] = shlex.split("rewardq " + command)
        return found

    def run_as_printed(argv: list[str]) -> str:
        assert argv[0] == "rewardq" and ["--namespace", ns] == argv[argv.index("--namespace") :][:2], argv
        assert ["--redis-url", url] == argv[argv.index("--redis-url") :][:2], argv
        rc, p = procs.run(argv[1:], timeout=60)
        assert rc == 0, (argv, p.stderr())
        return p.stdout()

    code, out, err = rq("dead-letters", "list", *base, env={"COLUMNS": "80"})
    assert code == 0, err
    assert not [line for line in out.splitlines() if len(line.rstrip()) > 80], out
    assert out.count(" \\\n") >= 3, out  # each long command broken with a line continuation
    listed = hints(out)
    assert set(listed) == {"details", "after a fix", "or all of them"}, out
    newest = listed["details"][3]
    assert "reason" in run_as_printed(listed["details"]) and newest in out
    code, out, err = rq("dead-letters", "show", newest, *base)
    shown = hints(out)
    assert set(shown) == {"retry after a fix", "delete"}, out
    assert shown["retry after a fix"] == listed["after a fix"]
    assert "retried 1 dead letter" in run_as_printed(listed["after a fix"])
    assert r.xlen(ks.dead(0)) == 1
    assert "retried 1 dead letter" in run_as_printed(listed["or all of them"])
    assert r.xlen(ks.dead(0)) == 0
    client.close()
    # a REF that is not there: the hint names the namespace too
    code, _, err = rq("dead-letters", "show", "0:1-0", *base)
    assert code == 1 and f"dead-letters list --redis-url {url} --namespace {ns}" in err, err
