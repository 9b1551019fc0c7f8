"""One namespace, one scoring configuration; a Redis user's permissions checked when a worker starts.

Real ``rewardq worker`` processes on the shared Redis (a namespace of their own) and, for ACL users,
on throwaway redis-servers.
"""

from __future__ import annotations

import asyncio
import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from rewardq import RewardClient
from rewardq.consumers.scoring_gate import ScoringGate
from rewardq.errors import RedisPermissionError, ScoringConflict
from rewardq.queue import access
from rewardq.queue.connection import connect_async
from rewardq.queue.keys import Keyspace
from rewardq.queue.scoring_record import RecordedScoring, recorded_scoring, replace_scoring
from rewardq.reward.scoring_fingerprint import ScoringFingerprint
from tests.support.cli_procs import Proc, Procs, wait_for, worker_argv
from tests.support.cluster import LocalCluster
from tests.support.proc_worker import WorkerProcess
from tests.support.records import text_output
from tests.support.redis_server import RedisServer
from tests.support.sync_client import connect

SAMPLE = {"data_source": "bonus", "reward_model": {"ground_truth": "42"}}


def _exit_and_log(w: WorkerProcess, timeout: float = 120) -> tuple[int, str]:
    try:
        code = w.wait(timeout)
    finally:
        w.kill()
    return code, w.log()


def _recorded(url: str, ns: str) -> dict[str, Any]:
    r = connect(url)
    try:
        raw = r.hget(Keyspace(ns).meta, "scoring")
        return dict(json.loads(raw)) if raw else {}
    finally:
        r.close()


def test_a_second_worker_with_another_manager_refuses_naming_both(redis_url: str, ns: str, tmp_path: Path) -> None:
    # Given a naive worker serving the namespace
    first = WorkerProcess(redis_url, ns, cli=True, log_dir=tmp_path, name="naive-w", manager="naive")
    same = None
    try:
        assert first.wait_for_log("worker naive-w started", 120), first.log()
        assert "manager=naive" in _recorded(redis_url, ns)["config"]
        # When a dapo worker starts on the same namespace (and, beside it, a second naive one)
        dapo = WorkerProcess(redis_url, ns, cli=True, log_dir=tmp_path, name="dapo-w", manager="dapo")
        same = WorkerProcess(redis_url, ns, cli=True, log_dir=tmp_path, name="naive-2", manager="naive")
        code, log = _exit_and_log(dapo)
        # Then it exits 2 with one line naming both configurations, who runs the recorded one, and the ways on
        assert code == 2, log
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in log, log
        line = errors[0]
        assert "manager=naive" in line and "manager=dapo" in line, line
        assert "naive-w" in line and "--namespace" in line and "--takeover" in line, line
        assert "worker dapo-w started" not in log
        # and the second worker with the same configuration joins
        assert same.wait_for_log("worker naive-2 started", 120), same.log()
        assert same.terminate() == 0, same.log()
        # and the first one is untouched: still alive, still the recorded configuration
        assert first.alive() and "manager=naive" in _recorded(redis_url, ns)["config"]
    finally:
        if same is not None:
            same.kill()
        first.terminate()


REWARD_WITH_BONUS = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, keyword_bonus=0.0):
    return (1.0 if ground_truth in solution_str else 0.0) + (keyword_bonus if "please" in solution_str else 0.0)
"""


def test_workers_whose_reward_kwargs_differ_in_one_value_do_not_share_a_namespace(
    procs: Procs, redis_url: str, ns: str, tmp_path: Path
) -> None:
    # Given a worker scoring with keyword_bonus 0.0 (a kwarg whose name holds "key")
    reward = tmp_path / "bonus.py"
    reward.write_text(REWARD_WITH_BONUS)
    args = ["--reward-fn", str(reward), "--log-level", "INFO"]
    first = procs.start(
        worker_argv(redis_url, ns, "bonus-0", *args, "--reward-fn-kwargs", '{"keyword_bonus": 0.0}'), tag="w0"
    )
    wait_for(lambda: "worker bonus-0 started" in first.stderr(), 120, "the first worker", procs=[first])
    # When a second one starts on the namespace with keyword_bonus 1.0
    second = procs.start(
        worker_argv(redis_url, ns, "bonus-1", *args, "--reward-fn-kwargs", '{"keyword_bonus": 1.0}'), tag="w1"
    )
    # Then it exits 2 with one line naming both configurations and the value that differs
    code, log = second.wait(120), second.stderr()
    assert code == 2, log
    [line] = [line for line in log.splitlines() if line.startswith("error:")]
    assert '"keyword_bonus":0' in line and '"keyword_bonus":1' in line, line
    assert "reward_kwargs.keyword_bonus: 1 here, 0 recorded" in line and "bonus-0" in line, line
    assert "worker bonus-1 started" not in log and "Traceback" not in log
    # and every reward comes from the recorded configuration
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        keys = [client.put_trajectory(f"b{i}", "s", [text_output("42, please")], SAMPLE)[0] for i in range(20)]
        results = client.wait_rewards(keys, timeout=120)
    finally:
        client.close()
    assert {r.reward_score for r in results.values()} == {1.0} and {r.worker for r in results.values()} == {"bonus-0"}
    assert first.terminate() == 0, first.stderr()[-2000:]


REWARD_BY_MODE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, mode="sk-strict-grading-mode-v2"):
    return 1.0 if "strict" in mode else 2.0
"""


def test_workers_whose_kwargs_differ_in_values_that_look_like_keys_do_not_share_a_namespace(
    procs: Procs, redis_url: str, ns: str, tmp_path: Path
) -> None:
    # Given a worker whose reward-function mode looks like an API key ("sk-" and 16 more characters)
    reward = tmp_path / "by_mode.py"
    reward.write_text(REWARD_BY_MODE)
    strict, lenient = "sk-strict-grading-mode-v2", "sk-lenient-grading-mode-v1"
    args = ["--reward-fn", str(reward), "--log-level", "INFO"]
    first = procs.start(
        worker_argv(redis_url, ns, "first-w", *args, "--reward-fn-kwargs", json.dumps({"mode": strict})), tag="w0"
    )
    wait_for(lambda: "worker first-w started" in first.stderr(), 120, "the first worker", procs=[first])
    # When a second one starts on the namespace with another such mode
    second = procs.start(
        worker_argv(redis_url, ns, "second-w", *args, "--reward-fn-kwargs", json.dumps({"mode": lenient})), tag="w1"
    )
    # Then it exits 2, naming the kwarg that differs, saying it was masked, showing neither value
    code, log = second.wait(120), second.stderr()
    assert code == 2, log
    [line] = [line for line in log.splitlines() if line.startswith("error:")]
    assert "reward_kwargs.mode: *** <masked sha256:" in line and "first-w" in line, line
    assert "masked: looks like a credential; its digest still counts" in line, line
    assert strict not in log and lenient not in log and strict not in first.stderr(), log
    assert "worker second-w started" not in log and "Traceback" not in log
    # and neither value is stored in the namespace's record
    assert strict not in json.dumps(_recorded(redis_url, ns)) and "*** <masked" in _recorded(redis_url, ns)["config"]
    # and every reward comes from the recorded configuration
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        keys = [client.put_trajectory(f"m{i}", "s", [text_output("42")], SAMPLE)[0] for i in range(20)]
        results = client.wait_rewards(keys, timeout=120)
    finally:
        client.close()
    assert {r.reward_score for r in results.values()} == {1.0} and {r.worker for r in results.values()} == {"first-w"}
    assert first.terminate() == 0, first.stderr()[-2000:]


KEYED_MANAGER = """
from dataclasses import dataclass
from typing import ClassVar

from rewardq.reward import RewardManager
from rewardq.reward.options import ManagerOptions, option


@dataclass(frozen=True)
class KeyedOptions(ManagerOptions):
    manager: ClassVar[str] = "keyed"

    api_key: str | None = option(None, "The API key.", secret=True)
    bonus: float = option(0.0, "Added to every reward.")


class KeyedManager(RewardManager):
    Options = KeyedOptions

    def __init__(self, tokenizer, compute_score=None, *, context=None, options=None):
        super().__init__(tokenizer, compute_score, context=context)
        self.bonus = options.bonus

    async def run_single(self, data):
        return {"reward_score": 1.0 + self.bonus, "reward_extra_info": {}}
"""


def _logged(proc: Proc, line: str) -> bool:
    return line in proc.stderr()


def test_workers_that_differ_only_in_an_option_declared_secret_share_a_namespace(
    procs: Procs, redis_url: str, ns: str, tmp_path: Path
) -> None:
    # Given a worker of a manager that declares api_key a credential
    manager = tmp_path / "keyed.py"
    manager.write_text(KEYED_MANAGER)
    spec = ["--manager", f"{manager}:KeyedManager", "--log-level", "INFO"]
    keys = ["sk-" + "a1" * 12, "sk-" + "b2" * 12]

    def start(name: str, key: str, bonus: str) -> Proc:
        opts = ["--manager-option", f"api_key={key}", "--manager-option", f"bonus={bonus}"]
        return procs.start(worker_argv(redis_url, ns, name, *spec, *opts), tag=name)

    workers = [start("k0", keys[0], "0.5")]
    wait_for(partial(_logged, workers[0], "worker k0 started"), 120, "worker k0", procs=workers)
    # When a second worker starts with another key (a rotation, one worker at a time), and beside it
    # one with another bonus and the first key
    workers.append(start("k1", keys[1], "0.5"))
    other = start("k2", keys[0], "1")
    wait_for(partial(_logged, workers[1], "worker k1 started"), 120, "worker k1", procs=workers)
    # Then both run, the record names the option left out, and no key is logged or stored
    recorded = _recorded(redis_url, ns)
    assert "secret=options.api_key (declared credentials: not counted)" in recorded["config"], recorded
    for w in workers:
        assert not any(k in w.stderr() for k in keys) and w.popen.poll() is None, w.stderr()[-2000:]
    assert not any(k in json.dumps(recorded) for k in keys)
    # But another bonus, even with the same key, is another configuration
    code, log = other.wait(120), other.stderr()
    assert code == 2 and "options.bonus: 1 here, 0.5 recorded" in log, log
    for w in workers:
        assert w.terminate() == 0, w.stderr()[-2000:]


def test_takeover_waits_for_the_old_workers_then_records_its_own(redis_url: str, ns: str, tmp_path: Path) -> None:
    # Given a naive worker serving the namespace
    old = WorkerProcess(
        redis_url, ns, cli=True, log_dir=tmp_path, name="old-w", manager="naive", heartbeat_interval=0.5
    )
    new = None
    try:
        assert old.wait_for_log("worker old-w started", 120), old.log()
        before = _recorded(redis_url, ns)
        # When a dapo worker starts with --takeover
        new = WorkerProcess(redis_url, ns, cli=True, log_dir=tmp_path, name="new-w", manager="dapo", takeover=True)
        # Then it waits, visibly, naming the old worker, and records nothing while the old one lives
        assert new.wait_for_log("takeover: waiting", 120), new.log()
        assert "old-w" in new.log() and new.alive()
        assert _recorded(redis_url, ns)["digest"] == before["digest"]
        assert "worker new-w started" not in new.log()
        # When the old worker stops (the rolling upgrade), the new one records its configuration and starts
        assert old.terminate() == 0
        assert new.wait_for_log("worker new-w started", 60), new.log()
        after = _recorded(redis_url, ns)
        assert after["digest"] != before["digest"] and "manager=dapo" in after["config"], after
        assert "takeover: namespace" in new.log()
        # And a worker of the old configuration is now the one refused
        code, log = _exit_and_log(
            WorkerProcess(redis_url, ns, cli=True, log_dir=tmp_path, name="late", manager="naive")
        )
        assert code == 2 and "manager=dapo" in log and "manager=naive" in log, log
    finally:
        old.terminate()
        if new is not None:
            assert new.terminate() == 0, new.log()


def test_an_old_worker_that_was_superseded_stops_with_exit_2(redis_url: str, ns: str, tmp_path: Path) -> None:
    # Given a naive worker, and a takeover that replaced the namespace's record behind its back
    # (as after a partition long enough for its heartbeat to lapse)
    w = WorkerProcess(redis_url, ns, cli=True, log_dir=tmp_path, name="stale", manager="naive", heartbeat_interval=0.5)
    try:
        assert w.wait_for_log("worker stale started", 120), w.log()
        r = connect(redis_url)
        r.hset(Keyspace(ns).meta, "scoring", json.dumps({"digest": "0" * 16, "config": "manager=dapo (new)"}))
        r.close()
        # Then it stops taking work and exits 2 saying why
        code, log = _exit_and_log(w, 60)
        assert code == 2, log
        assert "superseded" in log and "manager=dapo (new)" in log, log
    finally:
        w.kill()


def _worker_as(srv: RedisServer, tmp_path: Path, user: str, *rules: str) -> WorkerProcess:
    """A worker started as ``user``, a new ACL user with ``rules`` on the ``acl`` namespace."""
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", user, "on", f">{user}-pw", "~acl:*", "&*", *rules)
    admin.close()
    return WorkerProcess(srv.url_for(user, f"{user}-pw"), "acl", cli=True, log_dir=tmp_path, name=user, manager="naive")


def _one_permission_line(w: WorkerProcess, command: str) -> str:
    user = w.name
    code, log = _exit_and_log(w)
    assert code == 2, log
    assert "Traceback" not in log and "this is a bug" not in log, log
    errors = [line for line in log.splitlines() if "NOPERM" in line]
    assert len(errors) == 1, log
    line = errors[0]
    assert f"may not run {command} " in line and f"ACL SETUSER {user} ~acl:*" in line, line
    assert f"worker {user} started" not in log and f"{user}-pw" not in log
    return line


def test_a_user_without_a_command_the_worker_needs_is_refused_at_start(tmp_path: Path) -> None:
    with RedisServer(password="admin-pw") as srv:
        # Five workers start at once, each as a user of its own:
        refused = [
            # without EVALSHA, a user who may run ACL DRYRUN (checked without running anything)
            ("EVALSHA", _worker_as(srv, tmp_path, "no-evalsha", "+@all", "-evalsha")),
            # without EVALSHA, nor ACL (the usual restricted user): each command tried harmlessly
            ("EVALSHA", _worker_as(srv, tmp_path, "plain", "+@all", "-acl", "-evalsha")),
            # without XCLAIM, the command that reclaims a dead worker's entries
            ("XCLAIM", _worker_as(srv, tmp_path, "no-xclaim", "+@all", "-acl", "-xclaim")),
            # without SCRIPT LOAD only (a subcommand)
            ("SCRIPT LOAD", _worker_as(srv, tmp_path, "no-load", "+@all", "-acl", "-script|load")),
        ]
        # the worker reclaims with XPENDING + XCLAIM and never sends XAUTOCLAIM: a user without it serves
        serving = _worker_as(srv, tmp_path, "no-xautoclaim", "+@all", "-acl", "-xautoclaim")
        try:
            lines = [_one_permission_line(w, command) for command, w in refused]
            assert "+@scripting" in lines[-1]
            assert serving.wait_for_log("worker no-xautoclaim started", 120), serving.log()
            code = serving.terminate()
            assert code == 0 and "NOPERM" not in serving.log(), serving.log()
        finally:
            for w in [*(w for _, w in refused), serving]:
                w.kill()
        # and the probes left no key behind
        admin = srv.client()
        assert not list(admin.scan_iter("acl:{probe-*")), list(admin.scan_iter("acl:*"))
        admin.close()


async def test_both_ways_of_checking_find_the_same_refusal(tmp_path: Path) -> None:
    # ACL DRYRUN when the user may run it, harmless tries when not: each names the refused command
    with RedisServer(password="admin-pw") as srv:
        admin = srv.client()
        for user, rules in (("dry", ("+@all", "-xclaim")), ("tries", ("+@all", "-acl", "-xclaim"))):
            admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~acl:*", "&*", *rules)
        ks = Keyspace("acl")
        calls = [
            (c, access.probe(c, "acl:{p}:a", "acl:{p}:b", "acl:{p}:h", "acl:{p}:z", ks.group))
            for c in access.worker_commands()
        ]
        dry = connect_async(srv.url_for("dry", "pw"))
        tries = connect_async(srv.url_for("tries", "pw"))
        try:
            assert await access._dry_run(dry, "dry", calls) == ["XCLAIM"]
            assert await access._dry_run(tries, "tries", calls) is None  # may not run ACL DRYRUN: tries instead
            for client in (dry, tries):
                with pytest.raises(RedisPermissionError, match="may not run XCLAIM "):
                    await access.check_worker_access(client, ks, srv.url)
        finally:
            await dry.aclose()
            await tries.aclose()
        assert not list(admin.scan_iter("acl:*"))
        admin.close()


async def test_the_check_runs_on_redis_cluster(redis_cluster: LocalCluster) -> None:
    nodes = [connect(f"redis://127.0.0.1:{p}/0") for p in redis_cluster.ports]
    for node in nodes:
        node.execute_command("ACL", "SETUSER", "cl-noevalsha", "on", ">pw", "~acl:*", "&*", "+@all", "-acl", "-evalsha")
        node.execute_command("ACL", "SETUSER", "cl-full", "on", ">pw", "~acl:*", "&*", "+@all", "-acl")
    port = redis_cluster.ports[0]
    ks = Keyspace("acl")
    refused = connect_async(f"redis+cluster://cl-noevalsha:pw@127.0.0.1:{port}")
    full = connect_async(f"redis+cluster://cl-full:pw@127.0.0.1:{port}")
    try:
        with pytest.raises(RedisPermissionError, match="may not run EVALSHA "):
            await access.check_worker_access(refused, ks, redis_cluster.url)
        await access.check_worker_access(full, ks, redis_cluster.url)  # everything permitted: no error
    finally:
        await refused.aclose()
        await full.aclose()
        for node in nodes:
            node.execute_command("ACL", "DELUSER", "cl-noevalsha", "cl-full")
            node.close()


async def test_takeover_gates_of_one_configuration_agree_and_a_stale_one_replaces_nothing(
    redis_url: str, ns: str
) -> None:
    client = connect_async(redis_url)
    ks = Keyspace(ns)
    old, new = ScoringFingerprint("a" * 16, "manager=naive"), ScoringFingerprint("b" * 16, "manager=dapo")
    try:
        assert await ScoringGate(client, ks, old).join()
        # a live worker of the old configuration holds the takeover back
        await client.hset(ks.worker("old-1"), mapping={"scoring": old.digest, "last_beat": "1"})  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
        await client.zadd(ks.workers, {"old-1": 1})
        gates = [ScoringGate(client, ks, new, takeover=True, poll=0.05) for _ in range(3)]
        waiting = [asyncio.create_task(g.join()) for g in gates]
        await asyncio.sleep(0.5)
        assert not any(t.done() for t in waiting)
        assert (await recorded_scoring(client, ks)).digest == old.digest  # type: ignore[union-attr]
        # the old worker's heartbeat ends: every takeover gate of the new configuration goes on
        await client.delete(ks.worker("old-1"))
        assert await asyncio.wait_for(asyncio.gather(*waiting), 10) == [True, True, True]
        assert (await recorded_scoring(client, ks)).digest == new.digest  # type: ignore[union-attr]
        # a replace that saw the old record changes nothing now
        stale = RecordedScoring(old.digest, old.text)
        third = RecordedScoring("c" * 16, "manager=gdpo")
        assert not await replace_scoring(client, ks, stale, third)
        assert (await recorded_scoring(client, ks)).digest == new.digest  # type: ignore[union-attr]
        # and a gate of the old configuration without --takeover is refused, naming both
        with pytest.raises(ScoringConflict, match=r"manager=dapo.*manager=naive"):
            await ScoringGate(client, ks, old).join()
        # a takeover gate asked to stop while it waits gives up without recording
        await client.hset(ks.worker("new-1"), mapping={"scoring": new.digest, "last_beat": "1"})  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
        await client.zadd(ks.workers, {"new-1": 1})
        stop = asyncio.Event()
        gate = ScoringGate(client, ks, old, takeover=True, stopping=stop.is_set, poll=0.05)
        task = asyncio.create_task(gate.join())
        await asyncio.sleep(0.2)
        stop.set()
        assert await asyncio.wait_for(task, 5) is False
        assert (await recorded_scoring(client, ks)).digest == new.digest  # type: ignore[union-attr]
    finally:
        await client.delete(ks.worker("new-1"), ks.workers)
        await client.aclose()
