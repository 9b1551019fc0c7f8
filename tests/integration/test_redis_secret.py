"""The Redis URL kept out of command lines and readable environments (rlimits mode's needs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rewardq.config import WorkerConfig
from rewardq.errors import ConfigError
from rewardq.ops.redis_secret import child_environment


def test_the_url_file_replaces_every_layer_but_the_flag(tmp_path: Path) -> None:
    f = tmp_path / "url"
    f.write_text("redis://:from-file@h:1/0\nignored\n")
    env = {"REWARDQ_REDIS_URL": "redis://:from-env@h:1/0", "REWARDQ_REDIS_URL_FILE": str(f)}
    cfg = WorkerConfig.load(env=env)
    assert cfg.redis_url == "redis://:from-file@h:1/0" and cfg.sources["redis_url"] == f"redis_url_file {f}"
    cfg = WorkerConfig.load(env=env, overrides={"redis_url": "redis://:from-flag@h:1/0"})
    assert cfg.redis_url == "redis://:from-flag@h:1/0"
    f.write_text("not a url\n")
    with pytest.raises(ConfigError, match="first line must be a Redis URL"):
        WorkerConfig.load(env=env)
    with pytest.raises(ConfigError, match="cannot read the Redis URL file"):
        WorkerConfig.load(env={"REWARDQ_REDIS_URL_FILE": str(tmp_path / "missing")})


def test_children_get_the_url_in_their_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWARDQ_REDIS_URL_FILE", "/some/file")
    env = child_environment("redis://:pw@h:1/0", from_flag=False)
    assert env["REWARDQ_REDIS_URL"] == "redis://:pw@h:1/0" and env["REWARDQ_REDIS_URL_FILE"] == "/some/file"
    env = child_environment("redis://:pw@h:1/0", from_flag=True)  # --redis-url wins over any file
    assert "REWARDQ_REDIS_URL_FILE" not in env


def test_conceal_removes_the_url_even_from_proc_environ_and_makes_the_process_undumpable() -> None:
    code = textwrap.dedent(
        """
        import ctypes, os
        from rewardq.ops.redis_secret import conceal
        conceal()
        libc = ctypes.CDLL(None)
        print(b"hunter2" in open("/proc/self/environ", "rb").read(), "REWARDQ_REDIS_URL" in os.environ,
              libc.getenv(b"REWARDQ_REDIS_URL"), libc.prctl(3, 0, 0, 0, 0))
        """
    )
    env = {"REWARDQ_REDIS_URL": "redis://:hunter2@h:1/0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "0", "0"]  # getenv: NULL; PR_GET_DUMPABLE: 0
