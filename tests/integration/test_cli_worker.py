"""``rewardq worker`` as real processes against the real Redis.

Given two worker processes started through the CLI, when 500 realistic trajectories are
pushed, then every key gets exactly the expected reward, each trajectory is finished once
(one ``done`` entry each), and both workers did part of the work. Also: SIGTERM exits 0,
file < env < flag precedence, JSON logs, the supervisor, and the one-line errors with exit
codes 2 (configuration) and 3 (Redis unreachable).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from rewardq.demo.data import make_trajectories
from rewardq.producers.client import RewardClient
from rewardq.queue.keys import Keyspace
from rewardq.reward.tokenizer import Tokenizer, load_tokenizer
from tests.support.checks import must
from tests.support.cli_procs import START_WAIT, Procs, wait_for, worker_argv
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_tokenizer("builtin:demo")


def test_two_worker_processes_score_500_trajectories_exactly_once(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, tokenizer: Tokenizer
) -> None:
    # Given `rewardq worker --processes 2`: a supervisor of two worker processes on a two-shard namespace
    sup = procs.start(
        worker_argv(
            redis_url,
            ns,
            "w",
            "--processes",
            "2",
            "--shards",
            "2",
            "--batch-size",
            "32",
            "--log-level",
            "WARNING",
            manager="naive",
        ),
        tag="sup",
    )
    names = ["w-0", "w-1"]
    beats = [f"{ns}:worker:{n}" for n in names]
    wait_for(lambda: all(sync_redis.exists(k) for k in beats), START_WAIT, "both heartbeats", procs=[sup])
    pids = [int(must(sync_redis.hget(k, "pid"))) for k in beats]
    assert len(set(pids)) == 2 and sup.pid not in pids
    trajectories = make_trajectories(500, seed=11, tokenizer=tokenizer)

    # When every trajectory is pushed and waited for
    with RewardClient.from_url(redis_url, namespace=ns) as client:
        assert client.keyspace.shards == 2
        keys_of = [client.put_trajectory(t["uid"], t["session_id"], t["outputs"], t["sample"]) for t in trajectories]
        results = client.wait_rewards([k for keys in keys_of for k in keys], timeout=60)

    # Then every key holds exactly the expected reward, with the same result on every key of a trajectory
    assert len(results) == sum(len(t["outputs"]) for t in trajectories) > 1000
    for t, keys in zip(trajectories, keys_of):
        for k in keys:
            r = results[k]
            assert r.ok, (k, r.error)
            assert r.reward_score == t["expected"], (k, r.reward_score, t["expected"])
            assert r.reward_extra_info["acc"] == t["expected"]
            assert r.worker == results[keys[-1]].worker
    assert {t["expected"] for t in trajectories} == {0.0, 1.0}

    # And each trajectory was finished exactly once: one done entry each, across both shards
    ks = Keyspace(ns, 2)
    done = [sync_redis.xrange(ks.done(s)) for s in range(2)]
    assert all(len(d) > 0 for d in done)
    done_tids = [f[b"tid"].decode() for d in done for _, f in d]
    assert len(done_tids) == len(set(done_tids)) == 500
    assert sum(sync_redis.xlen(ks.dead(s)) for s in range(2)) == 0

    # And both worker processes did part of the work
    by_worker: dict[str, int] = {}
    for keys in keys_of:
        w = results[keys[-1]].worker
        by_worker[w] = by_worker.get(w, 0) + 1
    assert set(by_worker) == set(names), by_worker
    assert min(by_worker.values()) > 0

    # When one worker process is killed outright, the supervisor restarts it under the same name
    os.kill(pids[0], signal.SIGKILL)
    wait_for(
        lambda: (sync_redis.hget(beats[0], "pid") or b"0") not in (b"0", str(pids[0]).encode()),
        120,
        "a restarted worker",
        procs=[sup],
    )
    alive = [int(must(sync_redis.hget(beats[0], "pid"))), pids[1]]
    assert "restarting" in sup.stderr()

    # And SIGTERM to the supervisor stops every worker, each exiting 0, and the supervisor exits 0
    assert sup.terminate(timeout=60) == 0
    for pid in alive:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not any(sync_redis.exists(k) for k in beats)


def test_config_precedence_json_logs_and_sigterm(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, tmp_path: Path, tokenizer: Tokenizer
) -> None:
    # Given a config file, environment variables and flags that disagree
    cfg = tmp_path / "worker.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "namespace": ns,
                "manager": "naive",
                "tokenizer": "builtin:demo",
                "concurrency": 3,
                "batch_size": 7,
                "claim_idle": 11.0,
                "name": "from-file",
                "log_format": "text",
                "log_summary_interval": 1,
                "redis_url": "redis://127.0.0.1:1/0",
            }
        )
    )
    env = {
        "REWARDQ_BATCH_SIZE": "8",
        "REWARDQ_CLAIM_IDLE": "12",
        "REWARDQ_NAME": "from-env",
        "REWARDQ_LOG_FORMAT": "json",
        "REWARDQ_REDIS_URL": redis_url,
    }
    w = procs.start(["worker", "--config", str(cfg), "--claim-idle", "13", "--name", "from-flag"], env=env)

    # Then the flag's name is the one registered: flags beat env beat the file
    wait_for(lambda: sync_redis.exists(f"{ns}:worker:from-flag"), START_WAIT, "heartbeat of from-flag", procs=[w])
    beat = {k.decode(): v.decode() for k, v in sync_redis.hgetall(f"{ns}:worker:from-flag").items()}
    assert beat["pid"] == str(w.pid) and beat["manager"] == "naive"
    assert not sync_redis.exists(f"{ns}:worker:from-env") and not sync_redis.exists(f"{ns}:worker:from-file")
    # ... and `rewardq health` sees it on this host, in its namespace only
    rc, health = procs.run(["health", "--namespace", ns], env={"REWARDQ_REDIS_URL": redis_url})
    assert rc == 0 and "from-flag" in health.stdout(), health.stderr()
    rc, health = procs.run(["health", "--namespace", ns + "-other", "--redis-url", redis_url])
    assert rc == 1 and "unhealthy" in health.stderr()

    # And the logs are JSON (env beat the file), with the effective configuration
    lines = [json.loads(line) for line in w.stderr().splitlines() if line.strip()]
    eff = next(rec for rec in lines if rec["message"].startswith("effective config"))
    assert {k: eff["config"][k] for k in ("concurrency", "batch_size", "claim_idle", "name", "log_format")} == {
        "concurrency": 3,
        "batch_size": 8,
        "claim_idle": 13.0,
        "name": "from-flag",
        "log_format": "json",
    }
    assert {"time", "level", "logger"} <= set(eff)

    # When it scores trajectories, the INFO log sums them up every log_summary_interval (from the
    # file) in one line with structured fields; no INFO line per trajectory
    ts = make_trajectories(3, seed=5, tokenizer=tokenizer)
    with RewardClient.from_url(redis_url, namespace=ns) as client:
        keys = [client.put_trajectory(t["uid"], t["session_id"], t["outputs"], t["sample"]) for t in ts]
        got = client.wait_rewards([k for ks in keys for k in ks], timeout=30)
        assert [got[ks[-1]].reward_score for ks in keys] == [t["expected"] for t in ts]

    def summed() -> int:
        recs = [json.loads(x) for x in w.stderr().splitlines() if '"trajectories":' in x]
        return sum(r["trajectories"] for r in recs if r["level"] == "INFO")

    wait_for(lambda: summed() == 3, 20, "summary lines counting the 3 trajectories", procs=[w])
    recs = [json.loads(x) for x in w.stderr().splitlines() if '"outcomes":' in x]
    assert sum(r["outcomes"].get("ok", 0) for r in recs) == 3 and all(r["mean_ms"] >= 0 for r in recs)
    assert not any(keys[0][-1].rpartition("_")[0] in x for x in w.stderr().splitlines())  # per trajectory: DEBUG

    # And SIGTERM stops it with exit code 0
    assert w.terminate() == 0
    assert not sync_redis.exists(f"{ns}:worker:from-flag")
    assert "stopped" in w.stderr().splitlines()[-1]


def test_errors_are_one_red_line_with_exit_codes(procs: Procs, redis_url: str, ns: str) -> None:
    # Given several broken invocations, run side by side
    cases = {
        "unknown-manager": (
            [
                "worker",
                "--redis-url",
                redis_url,
                "--namespace",
                ns,
                "--manager",
                "no-such-manager",
                "--tokenizer",
                "builtin:demo",
            ],
            {},
        ),
        "unreachable": (
            [
                "worker",
                "--redis-url",
                "redis://:hunter2@127.0.0.1:1/0",
                "--tokenizer",
                "builtin:demo",
                "--connect-timeout",
                "1",
            ],
            {},
        ),
        "bad-kwargs": (["worker", "--reward-kwargs", "[1, 2]"], {}),
        "bad-kwargs-debug-flag": (["--debug", "worker", "--reward-kwargs", "[1, 2]"], {}),
        "bad-kwargs-debug-env": (["worker", "--reward-kwargs", "[1, 2]"], {"REWARDQ_DEBUG": "1"}),
        "bad-env": (["worker"], {"REWARDQ_CONCURRENCY": "many"}),
        "bad-level": (["worker"], {"REWARDQ_LOG_LEVEL": "verbose"}),
    }
    started = {name: procs.start(args, env=env, tag=name) for name, (args, env) in cases.items()}
    # ... and a healthy worker that gets SIGTERM while still starting up (importing torch, building its manager)
    early = procs.start(worker_argv(redis_url, ns, "early", manager="naive"), tag="early")
    wait_for(lambda: "start-up: importing torch" in early.stderr(), 30, "the worker's first log line", procs=[early])
    early.popen.send_signal(signal.SIGTERM)
    rc = {name: p.wait(60) for name, p in started.items()}
    assert early.wait(60) == 0, early.stderr()
    err = {name: p.stderr() for name, p in started.items()}

    # Then an unknown manager is a configuration error (2) that lists the known managers
    assert rc["unknown-manager"] == 2, err["unknown-manager"]
    assert "unknown reward manager 'no-such-manager'" in err["unknown-manager"]
    for name in ("naive", "dapo", "gdpo", "limited", "remote"):
        assert name in err["unknown-manager"]
    # And an unreachable Redis exits 3 once --connect-timeout passed (the default waits forever), naming
    # the URL without its password
    assert rc["unreachable"] == 3, err["unreachable"]
    assert "redis://:***@127.0.0.1:1/0" in err["unreachable"] and "hunter2" not in err["unreachable"]
    # And bad values exit 2 with one line that names the setting; tracebacks only with --debug / REWARDQ_DEBUG
    assert rc["bad-kwargs"] == 2 and "--reward-kwargs must be a JSON object" in err["bad-kwargs"]
    assert rc["bad-env"] == 2 and "REWARDQ_CONCURRENCY='many'" in err["bad-env"]
    assert (
        rc["bad-level"] == 2
        and "log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got 'verbose'" in err["bad-level"]
    )
    for name in ("unknown-manager", "unreachable", "bad-kwargs", "bad-env", "bad-level"):
        assert "Traceback" not in err[name], err[name]
        assert err[name].count("error:") == 1, err[name]
    for name in ("bad-kwargs-debug-flag", "bad-kwargs-debug-env"):
        assert rc[name] == 2 and "Traceback" in err[name], err[name]
