"""A permission revoked while a worker runs: one line naming the ``ACL SETUSER`` grant, exit 2, and its
pending work left for another worker. Real ``python -m rewardq worker`` processes against a throwaway
password-protected redis-server."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rewardq import RewardClient
from tests.support.cli_procs import wait_for
from tests.support.proc_worker import WorkerProcess
from tests.support.records import text_output
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow

SLOW = "sleep:0.1"  # the reward function sleeps 0.1 s, then scores 1.0 (the ground truth is the response)
N = 200


@pytest.mark.parametrize("revoked", ["-evalsha", "-xclaim", "-xreadgroup", "-xack"])
def test_a_permission_revoked_mid_run_exits_2_in_one_line_and_leaves_the_work_to_others(
    tmp_path: Path, revoked: str
) -> None:
    ns = f"acl-{uuid.uuid4().hex[:8]}"
    with RedisServer(password="admin-pw") as srv:
        admin = srv.client()
        admin.execute_command("ACL", "SETUSER", "w", "on", ">w-pw", f"~{ns}:*", "&*", "+@all")
        settings: dict[str, Any] = {
            "manager": "naive",
            "reward_fn": "tests.support.misbehaving:misbehave",
            "concurrency": 4,
            "batch_size": 8,
            "claim_idle": 2,
            "lease_seconds": 2,
            "heartbeat_interval": 0.5,
            "maintenance_interval": 0.5,
        }
        client = RewardClient.from_url(srv.url_for(None, "admin-pw"), namespace=ns)
        sample = {"data_source": "test", "reward_model": {"ground_truth": SLOW}}
        keys = [key for i in range(N) for key in client.put_trajectory(f"t{i}", "0", [text_output(SLOW)], sample)]
        # Given a worker scoring them as an ACL user with every right on the namespace
        w = WorkerProcess(srv.url_for("w", "w-pw"), ns, cli=True, log_dir=tmp_path, name="narrowed", **settings)
        try:
            wait_for(lambda: sum(r is not None for r in client.get_rewards(keys).values()) >= 10, 180, "ten rewards")
            # When a command it needs is revoked while it runs
            admin.execute_command("ACL", "SETUSER", "w", revoked)
            t0 = time.monotonic()
            code = w.wait(120)
            took = time.monotonic() - t0
        finally:
            w.kill()
        log = w.log()
        # Then it exits 2 with the one line the start-up check gives, without a traceback
        assert code == 2, log
        assert "Traceback" not in log and "unexpected" not in log, log
        refusals = [line for line in log.splitlines() if "NOPERM" in line]
        assert len(refusals) == 1, log
        assert f"ACL SETUSER w ~{ns}:*" in refusals[0] and "'w'" in refusals[0], refusals
        assert "w-pw" not in log
        # And no trajectory was failed for it: every key still to score is pending (or unread), not an error
        answered = {k: r for k, r in client.get_rewards(keys).items() if r is not None}
        assert all(r.status == "ok" for r in answered.values()), [r for r in answered.values() if r.status != "ok"]
        left = N - len(answered)
        assert left > 0, "the worker finished everything before the revocation; nothing was left pending"
        # And no answered key's entry is left pending: a commit refused for a command it sends after
        # its writes (XACK) is refused before it writes anything
        stream = f"{ns}:{{s0}}:stream"
        plain: Any = admin  # redis-py's own client: its xpending_range (SyncClient types the summary only)
        ids = [p["message_id"] for p in plain.xpending_range(stream, "rewardq-workers", "-", "+", N)]
        pending = {f[b"key"].decode() for i in ids for _, f in admin.xrange(stream, i, i)}
        assert not pending & set(answered), sorted(pending & set(answered))
        # And another worker with every right scores them all
        other = WorkerProcess(srv.url_for(None, "admin-pw"), ns, cli=True, log_dir=tmp_path, name="full", **settings)
        try:
            results = client.wait_rewards(keys, timeout=240)
            assert all(r.status == "ok" and r.reward_score == 1.0 for r in results.values())
            print(f"{revoked[1:].upper()} revoked mid-run: exit {code} {took:.1f} s later, {left} left, all scored")
            assert other.terminate() == 0, other.log()
        finally:
            other.kill()
        client.close()
        admin.close()
