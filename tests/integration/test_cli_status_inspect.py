"""``rewardq status`` (table, --json, --watch: top's live view) and ``rewardq inspect`` against the real Redis, and
the help every operator command gives.

Commands run in-process (``tests.support.cli_ops.rq``), ``status --watch`` also as a real process on
a terminal. Workers run in-process (``tests.support.helpers.running_workers``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from pathlib import Path

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from tests.support.checks import must
from tests.support.cli_ops import arq, check_types, on_a_terminal, read_until, rq, wait_reading
from tests.support.helpers import SAMPLE, output, running_workers, until
from tests.support.managers import LengthManager
from tests.support.sync_client import SyncClient


def _hold_one(ns: str, r: SyncClient, client: RewardClient) -> None:
    """An entry read by a consumer that then died (``ghost``): pending, never acknowledged."""
    ks = Keyspace(ns)
    client.put_output("held", "s", 0, output(2, 2), SAMPLE, final=True)
    r.xgroup_create(ks.stream(0), ks.group, id="0", mkstream=True)
    assert r.xreadgroup(ks.group, "ghost", {ks.stream(0): ">"}, count=1)


async def _populate(ns: str, r: SyncClient, client: RewardClient) -> list[str]:
    """With workers running: a stuck trajectory, a later one without its final output, a junk
    record and a scored trajectory (whose keys are returned, once scored)."""
    ks = Keyspace(ns)
    client.put_output("stuck", "s", 0, output(2, 2), SAMPLE)
    client.put_output("stuck", "s", 3, output(2, 2), SAMPLE, final=True)
    await until(lambda: r.hget(ks.traj_key("stuck_s"), "stored") == b"2", "the worker to store stuck_s")
    await asyncio.sleep(0.4)  # so that nofinal_s is seen 0.4 s later: the oldest is stuck_s
    client.put_output("nofinal", "s", 0, output(2, 2), SAMPLE)
    r.xadd(ks.stream(0), {"key": "junk_s_0", "data": b"junk"})
    keys = client.put_trajectory("fine", "s", [output(3, 3, seed=1), output(3, 5, seed=2)], SAMPLE)
    await asyncio.to_thread(client.wait_rewards, keys, 10)
    await until(
        lambda: (
            r.hget(ks.worker("w0"), "scored") == b"1" and r.xlen(ks.dead(0)) == 1 and r.exists(ks.traj_key("nofinal_s"))
        ),
        "the heartbeat to count the scored trajectory",
    )
    return keys


STATUS_SPEC = {
    "namespace": str,
    "group": str,
    "shards": list,
    "workers": list,
    "dead_letters": int,
    "dead_letters_by_kind": dict,
    "waiting_total": int,
    "waiting": list,
    "recent": dict,
    "time": float,
    "redis_url": str,
    "shard_count": int,
    "diagnosis": list,
}
SHARD_SPEC = {
    "shard": int,
    "stream": str,
    "length": int,
    "lag": (int, type(None)),
    "pending": int,
    "consumers": int,
    "group": bool,
    "owners": list,
    "backlog": int,
    "backlog_exact": bool,
}
WORKER_SPEC = {
    "name": str,
    "host": str,
    "pid": int,
    "in_flight": int,
    "idle_s": float,
    "scored": int,
    "errors": int,
    "dead_letters": int,
    "reclaimed": int,
    "rate_per_s": float,
    "manager": str,
    "uptime_s": float,
    "in_flight_tids": list,
    "inactive_s": (float, type(None)),
    "pending": int,
}
WAITING_SPEC = {
    "tid": str,
    "shard": int,
    "have": list,
    "final": (int, type(None)),
    "missing": list,
    "waiting_for": str,
    "waited_s": float,
    "expires_in_s": float,
}
RECENT_SPEC = {
    "window_s": float,
    "trajectories": int,
    "errors": int,
    "trajectories_per_s": float,
    "latency_ms_p50": (float, type(None)),
    "latency_ms_p99": (float, type(None)),
}
# -- status ------------------------------------------------------------------------------------


async def test_status_lists_the_stuck_trajectory_workers_and_held_entries(
    ns: str, redis_url: str, sync_redis: SyncClient
) -> None:
    # Given a pipeline with a stuck trajectory, an entry held by a dead consumer and a live worker
    client = RewardClient.from_url(redis_url, namespace=ns)
    _hold_one(ns, sync_redis, client)
    async with running_workers(ns, redis_url, [LengthManager(None)], claim_idle=60, keep_records=60):
        t0 = time.time()
        await _populate(ns, sync_redis, client)
        await asyncio.sleep(0.3)
        # When an operator asks for the status, as JSON and as a table
        code, out, err = await arq("status", "--redis-url", redis_url, "--namespace", ns, "--json")
        tcode, table, terr = await arq("status", "--redis-url", redis_url, "--namespace", ns)
        lcode, limited, _ = await arq("status", "--namespace", ns, "--limit", "1", env={"REWARDQ_REDIS_URL": redis_url})
    assert code == 0 and tcode == 0 and lcode == 0, err + terr
    st = json.loads(out)
    # Then the JSON has the documented schema
    check_types(st, STATUS_SPEC)
    check_types(st["recent"], RECENT_SPEC)
    for sh in st["shards"]:
        check_types(sh, SHARD_SPEC)
    for w in st["workers"]:
        check_types(w, WORKER_SPEC)
    for w in st["waiting"]:
        check_types(w, WAITING_SPEC)
    # And the stuck trajectory is listed first (oldest), with its missing indices and how long it waited
    assert [w["tid"] for w in st["waiting"]] == ["stuck_s", "nofinal_s"] and st["waiting_total"] == 2
    stuck = st["waiting"][0]
    assert stuck["missing"] == [1, 2] and stuck["have"] == [0, 3] and stuck["final"] == 3
    assert stuck["waiting_for"] == "outputs 1,2" and 0.6 <= stuck["waited_s"] <= st["time"] - t0 + 0.1
    assert st["waiting"][1]["waited_s"] <= stuck["waited_s"] - 0.3 and stuck["expires_in_s"] > 500
    assert st["waiting"][1]["final"] is None and st["waiting"][1]["waiting_for"] == "the final output"
    # And the shard shows the entry held by the dead consumer, the worker its counters, one dead letter
    assert st["shards"][0]["pending"] == 1 and st["shards"][0]["owners"] == [
        {"name": "ghost", "pending": 1, "alive": False}
    ]
    assert [w["name"] for w in st["workers"]] == ["w0"] and st["workers"][0]["scored"] == 1
    assert st["workers"][0]["host"] == socket.gethostname() and st["workers"][0]["pid"] == os.getpid()
    assert st["dead_letters"] == 1 and st["dead_letters_by_kind"] == {"invalid": 1}
    # (the junk entry names the key junk_s_0, which got an error result: one errored trajectory)
    assert st["recent"]["trajectories"] == 2 and st["recent"]["errors"] == 1
    assert st["recent"]["latency_ms_p50"] is not None
    assert must(client.get_reward("junk_s_0")).status == "error"
    messages = " | ".join(d["message"] for d in st["diagnosis"])
    assert "1 entry held by consumers that are not alive: ghost (1)" in messages
    assert "the oldest, stuck_s, has waited" in messages and "for outputs 1,2" in messages
    assert {d["level"] for d in st["diagnosis"]} == {"warning"}
    # And the table says the same to a person
    row = next(line.split() for line in table.splitlines() if line.strip().startswith("stuck_s "))
    assert row[:7] == ["stuck_s", "0", "0,3", "3", "1,2", "outputs", "1,2"] and row[7].endswith("s"), row
    assert "waiting for outputs (2, oldest first)" in table and "w0" in table
    assert "ghost: 1 (not alive)" in table and "invalid: 1" in table
    assert "rewardq inspect stuck_s --namespace " + ns in table
    assert "waiting for outputs (2, oldest first, 1 shown)" in limited and "nofinal_s" not in limited

    # When the workers are gone and a new trajectory arrives, the diagnosis says nothing is scored
    client.put_trajectory("late", "s", [output(2, 2)], SAMPLE)
    code, out, _ = await arq("status", "--redis-url", redis_url, "--namespace", ns, "--json")
    st = json.loads(out)
    assert st["workers"] == [] and st["shards"][0]["backlog"] == 1
    assert st["diagnosis"][0]["level"] == "error" and "nothing is being scored" in st["diagnosis"][0]["message"]
    client.close()


def test_status_watch_is_the_live_view_of_top(ns: str, redis_url: str, sync_redis: SyncClient, tmp_path: Path) -> None:
    # Given one trajectory pushed and no worker
    RewardClient.from_url(redis_url, namespace=ns).put_output("lone", "s", 0, output(2, 2), SAMPLE, final=True)
    # --watch runs `rewardq top`: with --count it stops by itself, snapshots one after another when not on a terminal
    code, out, err = rq("status", "--redis-url", redis_url, "--namespace", ns, "--watch", "0.1", "--count", "2")
    assert code == 0, err
    assert out.count("rewardq top ") == 2 and out.count("backlog  1 entries") == 2 and ns in out, out
    assert "live workers" not in out  # top's screen, not status's tables
    code, out, _ = rq("status", "--redis-url", redis_url, "--namespace", ns, "--json", "--watch", "0.1", "--count", "3")
    frames = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(frames) == 3 and all(f["backlog"]["entries"] == 1 for f in frames)
    assert frames[0]["time"] < frames[2]["time"]
    code, out, _ = rq("top", "--redis-url", redis_url, "--namespace", ns, "--json")
    assert code == 0 and set(json.loads(out)) == set(frames[0])  # the very snapshot top prints
    # On a terminal it is top's live screen, which Ctrl-C ends with exit code 0
    watch = ["status", "--redis-url", redis_url, "--namespace", ns, "--watch", "0.2"]
    with on_a_terminal(watch, env={"COLUMNS": "160", "LINES": "60"}) as (proc, master):
        seen = read_until(master, "q quits", 20)
        proc.send_signal(signal.SIGINT)
        assert wait_reading(proc, master, 30) == 0
        assert "rewardq top" in seen and ns in seen


def test_status_unknown_namespace_and_unreachable_redis(ns: str, redis_url: str) -> None:
    _ = RewardClient.from_url(redis_url, namespace=ns).keyspace  # creates <ns>:meta
    code, out, err = rq("status", "--redis-url", redis_url, "--namespace", ns + "-typo")
    assert code == 1 and out == ""
    assert f"namespace '{ns}-typo' does not exist" in err and f"did you mean '{ns}'?" in err
    assert ns in err.split("namespaces on this server:")[1]
    assert "Traceback" not in err and err.count("error:") == 1
    code, _, err = rq("status", "--redis-url", "redis://:hunter2@127.0.0.1:1/0")
    assert code == 3 and "redis://:***@127.0.0.1:1/0" in err and "hunter2" not in err
    code, _, err = rq("status", "--namespace", "bad name")
    assert code == 2 and "namespace" in err


# -- inspect -----------------------------------------------------------------------------------

INSPECT_SPEC = {
    "ref": str,
    "tid": str,
    "shard": int,
    "state": str,
    "final": (int, type(None)),
    "have": list,
    "missing": list,
    "meta": dict,
    "outputs": list,
    "timings": dict,
    "namespace": str,
}
RECORD_SPEC = {"prompt_tokens": int, "response_tokens": int, "model_tokens": int, "sample": dict}
RESULT_SPEC = {"status": str, "reward_score": float, "reward_extra_info": dict, "worker": str}


async def test_inspect_a_key_a_trajectory_and_unknown_refs(ns: str, redis_url: str, sync_redis: SyncClient) -> None:
    client = RewardClient.from_url(redis_url, namespace=ns)
    async with running_workers(ns, redis_url, [LengthManager(None)], keep_records=60):
        await _populate(ns, sync_redis, client)
    # One key, as JSON: its record, its result, the trajectory's state and timings
    code, out, err = rq("inspect", "fine_s_1", "--redis-url", redis_url, "--namespace", ns, "--json")
    assert code == 0, err
    view = json.loads(out)
    check_types(view, INSPECT_SPEC)
    assert view["state"] == "done" and view["tid"] == "fine_s" and [o["key"] for o in view["outputs"]] == ["fine_s_1"]
    (o,) = view["outputs"]
    check_types(o["record"], RECORD_SPEC)
    check_types(o["result"], RESULT_SPEC)
    assert o["record"]["response_tokens"] == 5 and o["record"]["sample"]["reward_model"] == {"ground_truth": "42"}
    assert o["result"]["reward_score"] == 5.0 and o["result"]["reward_extra_info"] == {"rows": 2, "gt": "42"}
    assert o["result"]["worker"] == "w0" and view["meta"]["worker"] == "w0"
    t = view["timings"]
    assert t["first_seen"] <= t["done_at"] and t["latency_ms"] > 0
    # The whole trajectory, as a table with a decoded preview
    code, out, err = rq("inspect", "fine_s", "--redis-url", redis_url, "--namespace", ns, "--tokenizer", "builtin:demo")
    assert code == 0, err
    for text in (
        "fine_s_0",
        "fine_s_1",
        "done",
        "w0",
        "reward_extra_info",
        '"gt": "42"',
        "sample columns",
        "response:",
        "scored by",
    ):
        assert text in out, (text, out)
    code, out, _ = rq(
        "inspect", "fine_s", "--redis-url", redis_url, "--namespace", ns, "--tokenizer", "builtin:demo", "--json"
    )
    assert all(isinstance(o["record"]["response_preview"], str) for o in json.loads(out)["outputs"])
    # A stuck trajectory: collecting, with what it waits for; a Redis key copied from redis-cli works too
    code, out, _ = rq("inspect", "stuck_s", "--redis-url", redis_url, "--namespace", ns, "--json")
    stuck = json.loads(out)
    assert stuck["state"] == "collecting" and stuck["missing"] == [1, 2] and len(stuck["outputs"]) == 4
    code, out, _ = rq("inspect", "stuck_s", "--redis-url", redis_url, "--namespace", ns)
    assert "collecting" in out and "missing         1,2" in out and "no result" in out
    code, out, _ = rq(
        "inspect", Keyspace(ns).reward_key("fine_s_0"), "--redis-url", redis_url, "--namespace", ns, "--json"
    )
    (o,) = json.loads(out)["outputs"]
    assert code == 0 and o["key"] == "fine_s_0" and o["record"]["response_tokens"] == 3
    assert o["result"]["reward_score"] == 5.0  # the final output's length, copied to every key
    # Unknown refs exit 1 with what to check; a bad tokenizer is a configuration error
    for ref in ("nope_s", "nope_s_0"):
        code, out, err = rq("inspect", ref, "--redis-url", redis_url, "--namespace", ns)
        assert code == 1 and out == "" and f"nothing known about '{ref}'" in err and "--namespace" in err
        assert "Traceback" not in err
    code, _, err = rq("--debug", "inspect", "nope_s", "--redis-url", redis_url, "--namespace", ns)
    assert code == 1 and "Traceback" in err and "nothing known about 'nope_s'" in err  # traceback only when asked
    code, _, err = rq("inspect", "fine_s", "--redis-url", redis_url, "--namespace", ns, "--tokenizer", "/no/such")
    assert code == 2 and "/no/such" in err
    client.close()


async def test_inspect_a_scored_trajectory_whose_records_were_dropped(ns: str, redis_url: str) -> None:
    # Given workers that do not keep records (the default)
    client = RewardClient.from_url(redis_url, namespace=ns)
    async with running_workers(ns, redis_url, [LengthManager(None)]):
        keys = client.put_trajectory("plain", "s", [output(2, 3), output(2, 4)], SAMPLE)
        await asyncio.to_thread(client.wait_rewards, keys, 10)
    # Then inspect shows the rewards, nothing as missing, and how to keep records next time
    code, out, err = rq("inspect", "plain_s", "--redis-url", redis_url, "--namespace", ns, "--json")
    view = json.loads(out)
    assert code == 0 and view["state"] == "done" and view["missing"] == [] and not view["records_kept"]
    assert [o["result"]["reward_score"] for o in view["outputs"]] == [4.0, 4.0]
    assert all("record" not in o for o in view["outputs"])
    code, out, _ = rq("inspect", "plain_s", "--redis-url", redis_url, "--namespace", ns)
    assert "2, final index 1 (records deleted when it ended)" in out and "missing" not in out
    assert "--keep-records SECONDS (or REWARDQ_KEEP_RECORDS)" in out
    # One output key asked for: the count is still the trajectory's, not the one key shown
    code, out, _ = rq("inspect", "plain_s_1", "--redis-url", redis_url, "--namespace", ns)
    assert code == 0 and "2, final index 1 (records deleted when it ended)" in out
    client.close()


def test_help_defaults_and_helpers() -> None:
    from rewardq.ops import layout, target
    from rewardq.ops.inspect import normalize_ref

    assert (target.DEFAULT_NAMESPACE, target.DEFAULT_GROUP) == (Keyspace().namespace, Keyspace().group)
    code, out, _ = rq("--help")
    assert code == 0 and all(c in out for c in ("status", "inspect", "dead-letters", "health"))
    for cmd in (
        ["status"],
        ["inspect"],
        ["health"],
        ["dead-letters", "list"],
        ["dead-letters", "show"],
        ["dead-letters", "retry"],
        ["dead-letters", "purge"],
    ):
        code, out, _ = rq(*cmd, "--help")
        assert code == 0 and "--redis-url" in out and "--namespace" in out, cmd
    assert normalize_ref("ns:{s0}:reward:u_s_3", "ns") == "u_s_3"
    assert normalize_ref("ns:{s1.4}:traj:u_s", "ns") == "u_s" and normalize_ref("u_s_1", "ns") == "u_s_1"
    assert [layout.fmt_duration(x) for x in (None, 3.25, 245, 7380, 2 * 86400 + 3600)] == [
        "-",
        "3.2s",
        "4m05s",
        "2h03m",
        "2d01h",
    ]
