"""Redis that refuses us or is not there yet: one clear line, never a traceback; a worker waits.

Real ``python -m rewardq`` processes against throwaway redis-servers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.cli_procs import REPO
from tests.support.proc_worker import WorkerProcess
from tests.support.redis_server import RedisServer, free_port


def _rq(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDQ_")}
    return subprocess.run(
        [sys.executable, "-m", "rewardq", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


def _exit_and_log(w: WorkerProcess) -> tuple[int, str]:
    """``w``'s exit code (it must exit by itself within 120 s; it is killed either way) and its log."""
    try:
        code = w.wait(120)
    finally:
        w.kill()
    return code, w.log()


def test_acl_user_without_rights_on_the_namespace_gets_one_line_from_status_and_worker(tmp_path: Path) -> None:
    with RedisServer(password="admin-pw") as srv:
        admin = srv.client()
        admin.execute_command("ACL", "SETUSER", "narrow", "on", ">narrow-pw", "~elsewhere:*", "&*", "+@all")
        url = srv.url_for("narrow", "narrow-pw")
        # rewardq status on a namespace the user may not read
        out = _rq("status", "--redis-url", url, "--namespace", "locked")
        assert out.returncode == 2, out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
        assert "NOPERM" in lines[0] and "~locked:*" in lines[0] and "'narrow'" in lines[0], lines
        assert "narrow-pw" not in out.stderr and "this is a bug" not in out.stderr
        # a worker on it: the same one line, and an exit code that says "fix the setting"
        code, log = _exit_and_log(
            WorkerProcess(url, "locked", cli=True, log_dir=tmp_path, name="narrow-w", manager="naive")
        )
        assert code == 2, log
        assert "Traceback" not in log and "this is a bug" not in log, log
        errors = [line for line in log.splitlines() if "NOPERM" in line]
        assert len(errors) == 1 and "~locked:*" in errors[0], log
        # and the grant the line suggests is enough: status now finds no such namespace (exit 1)
        grant = lines[0].split("e.g. ACL SETUSER ")[1].split()
        assert admin.execute_command("ACL", "SETUSER", *grant) == b"OK"
        again = _rq("status", "--redis-url", url, "--namespace", "locked")
        assert again.returncode == 1 and "NOPERM" not in again.stderr, again
        assert "namespace 'locked' does not exist" in again.stderr, again.stderr
        admin.close()


def test_worker_started_before_redis_waits_visibly_then_serves(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    # with a connect timeout: gives up after it, exit 3, having said what it waited for
    t0 = time.monotonic()
    code, log = _exit_and_log(
        WorkerProcess(url, "early", cli=True, log_dir=tmp_path, name="gives-up", manager="naive", connect_timeout=2)
    )
    assert code == 3, log
    assert "redis not reachable yet (attempt 1" in log and "--connect-timeout 2s" in log, log
    assert 2 <= time.monotonic() - t0 < 60
    # without one (the default: forever): waits, then starts once Redis is up
    w = WorkerProcess(url, "early", cli=True, log_dir=tmp_path, name="waits", manager="naive")
    try:
        assert w.wait_for_log("still not reachable (attempt 2", 120), w.log()
        assert w.proc.poll() is None  # still waiting, not exited
        with RedisServer(port=port):
            assert w.wait_for_log("worker waits started", 120), w.log()
            assert w.terminate() == 0
    finally:
        w.kill()
    assert "waiting forever" in w.log() and "of forever" in w.log()
