"""The parts of ``rewardq worker`` that need no process: flags to overrides and back, manager
options, JSON log lines, the Redis probe's fast failure, the supervisor's child command lines."""

from __future__ import annotations

import json
import logging
import time

import pytest

from rewardq.errors import ConfigError
from rewardq.logs import JsonFormatter
from rewardq.ops import worker as ops_worker
from rewardq.ops.worker import overrides_from_flags
from rewardq.settings import NONE_GIVEN, parse_pairs


def test_manager_options_parse_json_values_and_nest() -> None:
    assert parse_pairs(
        "--manager-option",
        [
            "max_rpm=60",
            "base_url=http://x:8000",
            "overlong_buffer.enable=true",
            "overlong_buffer.len=512",
            "tags=[1, 2]",
        ],
    ) == {"max_rpm": 60, "base_url": "http://x:8000", "overlong_buffer": {"enable": True, "len": 512}, "tags": [1, 2]}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_pairs("--manager-option", ["oops"])


def test_only_given_flags_become_overrides_and_round_trip_to_argv() -> None:
    params = {
        "redis_url": "redis://h:1/0",
        "namespace": None,
        "concurrency": 4,
        "cluster": False,
        "manager_options": ("a=1", "b.c=x"),
        "reward_fn_kwargs": '{"k": 2}',
        "connect_timeout": NONE_GIVEN,
        "config": "c.yaml",
    }
    assert overrides_from_flags(params) == {
        "redis_url": ("redis://h:1/0", "flag --redis-url"),
        "concurrency": (4, "flag --concurrency"),
        "cluster": (False, "flag --cluster"),
        "manager_options": ({"a": 1, "b": {"c": "x"}}, "flag --manager-option"),
        "reward_fn_kwargs": ({"k": 2}, "flag --reward-kwargs"),
        "connect_timeout": (None, "flag --connect-timeout"),
    }
    argv = ops_worker.worker_argv(params)
    assert argv == [
        "--config",
        "c.yaml",
        "--redis-url",
        "redis://h:1/0",
        "--no-cluster",
        "--manager-option",
        "a=1",
        "--manager-option",
        "b.c=x",
        "--reward-kwargs",
        '{"k": 2}',
        "--concurrency",
        "4",
        "--connect-timeout",
        "none",
    ]
    # And the argv, parsed by the real command, gives the same overrides back
    from rewardq.cli import worker

    ctx = worker.make_context("worker", argv)
    assert overrides_from_flags(ctx.params) == overrides_from_flags(params)


def test_json_log_lines_carry_extra_fields() -> None:
    rec = logging.LogRecord("rewardq.worker", logging.INFO, __file__, 1, "trajectory %s done", ("u_s",), None)
    rec.tid, rec.outcome, rec.elapsed_ms = "u_s", "ok", 1.5
    out = json.loads(JsonFormatter().format(rec))
    assert out["message"] == "trajectory u_s done" and out["level"] == "INFO" and out["logger"] == "rewardq.worker"
    assert (out["tid"], out["outcome"], out["elapsed_ms"]) == ("u_s", "ok", 1.5)
    assert time.strptime(out["time"][:19], "%Y-%m-%dT%H:%M:%S")


def test_redis_connection_refused_probe_is_fast() -> None:
    from rewardq.errors import RedisUnavailable
    from rewardq.queue.reachability import probe_redis

    t0 = time.monotonic()
    with pytest.raises(RedisUnavailable, match=r"redis://user:\*\*\*@127.0.0.1:1/0"):
        probe_redis("redis://user:pw@127.0.0.1:1/0")
    assert time.monotonic() - t0 < 2


def test_supervisor_child_command_lines() -> None:
    from rewardq.ops.supervisor import child_argvs

    argvs = child_argvs(["--namespace", "n"], 2, name="w", metrics_port=9100, prefix=["--debug"])
    assert [a[a.index("-m") + 1 :] for a in argvs] == [
        ["rewardq", "--debug", "worker", "--namespace", "n", "--name", "w-0", "--metrics-port", "9100"],
        ["rewardq", "--debug", "worker", "--namespace", "n", "--name", "w-1", "--metrics-port", "9101"],
    ]
    assert all(a[-1] == "0" for a in child_argvs([], 3, name=None, metrics_port=0))
    assert all(
        "--name" not in a and "--metrics-port" not in a for a in child_argvs([], 2, name=None, metrics_port=None)
    )
