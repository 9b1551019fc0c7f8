"""Security: credentials and TLS through the URL, secrets kept out of logs and Redis, no
pickle, bounded decoding, and code loaded only from the operator's configuration.

Workers here are the real ``python -m rewardq worker`` command against throwaway
redis-servers (password, ACL user, TLS with a throwaway CA made by openssl).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgpack
import numpy as np
import pytest
import redis

from rewardq import PutError, RecordError, RewardClient
from rewardq.errors import RedisPermissionError
from rewardq.queue.codec import decode_output, encode_output, peek_identity
from rewardq.queue.connection import redact_url
from rewardq.queue.keys import Keyspace
from tests.support.cli_procs import REPO, START_WAIT
from tests.support.exactly_once import make_trajectories, push, settle
from tests.support.proc_worker import WorkerProcess
from tests.support.redis_server import RedisServer
from tests.support.sync_client import SyncClient

ECHO = "tests.support.managers:EchoManager"
FAST: dict[str, Any] = dict(
    manager=ECHO, heartbeat_interval=0.3, lease_seconds=1.5, claim_idle=2.0, maintenance_interval=0.3, block_ms=200
)
PASSWORD = "Pw-7q!x/K@z:9%"  # URL-special characters on purpose
START_TIMEOUT = START_WAIT


def _ns() -> str:
    return f"sec-{uuid.uuid4().hex[:6]}"


def _score_through(url: str, tmp_path: Path, *, name: str, **extra: Any) -> tuple[WorkerProcess, RewardClient, str]:
    """Start a CLI worker on ``url``, push a few trajectories with a client on ``url``, check them."""
    ns = _ns()
    worker = WorkerProcess(url, ns, cli=True, log_dir=tmp_path, name=name, **{**FAST, **extra})
    assert worker.wait_for_log(f"worker {name} started", START_TIMEOUT), worker.log()
    client = RewardClient.from_url(url, namespace=ns)
    jobs = make_trajectories(5, seed=9)
    keys = push(client, jobs)
    client.wait_rewards(keys, timeout=60)
    verdict = settle(client.r, Keyspace(ns), {k: v for j in jobs for k, v in j.expected.items()})
    assert verdict.clean, verdict.explain()
    return worker, client, ns


def _all_values(r: SyncClient, ns: str) -> bytes:
    """Every key name and value of a namespace, concatenated (to search for secrets)."""
    out = []
    for key in r.scan_iter(match=f"{ns}:*"):
        out.append(key)
        kind = r.type(key)
        if kind == b"hash":
            for k, v in r.hgetall(key).items():
                out += [k, v]
        elif kind == b"stream":
            for _, fields in r.xrange(key):
                for k, v in fields.items():
                    out += [k, v]
        elif kind == b"zset":
            out += r.zrange(key, 0, -1)
        elif kind == b"string":
            out.append(r.get(key) or b"")
    return b"\n".join(out)


def _secret_forms(pw: str) -> list[str]:
    return [pw, quote(pw, safe=""), pw[:6]]


def test_password_in_url_works_and_never_shows_in_logs_status_or_redis(tmp_path: Path) -> None:
    with RedisServer(password=PASSWORD, appendonly=True) as srv:
        assert "%40" in srv.url and PASSWORD not in srv.url  # the URL carries it quoted
        worker, client, ns = _score_through(srv.url, tmp_path, name="pw-worker", log_level="debug")
        try:
            # a restart makes the worker log its reconnection attempts, and re-authenticate
            srv.restart()
            jobs = make_trajectories(3, seed=21, prefix="after")
            keys = push(client, jobs)
            client.wait_rewards(keys, timeout=60)
            r = srv.client()
            beat = r.hgetall(Keyspace(ns).worker("pw-worker"))
            assert beat and b"pid" in beat
            # `rewardq status` (while the worker is alive), text and JSON
            shown = []
            for extra in ([], ["--json"]):
                out = subprocess.run(
                    [sys.executable, "-m", "rewardq", "status", "--redis-url", srv.url, "--namespace", ns, *extra],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    cwd=REPO,
                    env={**os.environ, "COLUMNS": "200"},
                )
                assert out.returncode == 0, out.stderr
                shown.append(out.stdout + out.stderr)
            assert "pw-worker" in shown[1] and ":***@127.0.0.1" in shown[1]
            stored = _all_values(r, ns)
            r.close()
            assert worker.terminate() == 0
            log = worker.log()
            assert "redis://:***@127.0.0.1" in log  # the URL is logged, redacted
            for secret in _secret_forms(PASSWORD):
                assert secret not in log, f"{secret!r} leaked into the worker log"
                assert all(secret not in text for text in shown), f"{secret!r} leaked into `rewardq status`"
                assert secret.encode() not in stored, f"{secret!r} leaked into Redis"
        finally:
            worker.kill()
            client.close()

        # a wrong password: a quick, clear error on both sides, which does not echo the password
        bad = srv.url_for(password="Wrong-Pw-123")
        t0 = time.monotonic()
        with pytest.raises(PutError, match="Redis refused the credentials .*invalid username-password pair"):
            RewardClient.from_url(bad, namespace="x").put_trajectory(
                "u", "s", [{"prompt_ids": [1], "response_ids": [2]}]
            )
        assert time.monotonic() - t0 < 5, "a refused password must not be retried with backoff"
        w = WorkerProcess(bad, "x", cli=True, log_dir=tmp_path, name="bad-pw")
        try:
            assert w.wait(START_TIMEOUT) != 0
        finally:
            w.kill()
        assert "refused the credentials" in w.log() and "Wrong-Pw" not in w.log()


def test_acl_user_works_for_client_and_worker(tmp_path: Path) -> None:
    with RedisServer(password="admin-pw") as srv:
        admin = srv.client()
        assert admin.execute_command("ACL", "SETUSER", "rq", "on", ">rq-Secret-1", "~*", "&*", "+@all") == b"OK"
        url = srv.url_for("rq", "rq-Secret-1")
        worker, client, ns = _score_through(url, tmp_path, name="acl-worker")
        try:
            users = re.findall(rb"user=(\S+)", admin.execute_command("CLIENT", "LIST"))
            assert users.count(b"rq") >= 2, users  # the worker's and the producer's connections
            beat = admin.hgetall(Keyspace(ns).worker("acl-worker"))
            assert beat and all(b"rq-Secret" not in v for v in beat.values())
            assert worker.terminate() == 0
            assert "rq-Secret" not in worker.log() and "redis://rq:***@" in worker.log()
        finally:
            worker.kill()
            client.close()
        # a user without write permission gets Redis's NOPERM, naming the command, and the grant
        admin.execute_command("ACL", "SETUSER", "reader", "on", ">r-pw", "~*", "+@read", "+ping", "+hello")
        ro = RewardClient.from_url(srv.url_for("reader", "r-pw"), namespace=ns)
        with pytest.raises(RedisPermissionError, match=r"permissions to run the '(hsetnx|multi)' command") as info:
            push(ro, make_trajectories(1))
        assert "ACL SETUSER reader" in str(info.value) and f"~{ns}:*" in str(info.value)
        ro.close()
        admin.close()


def test_tls_rediss_url_works_for_client_and_worker(tmp_path: Path) -> None:
    with RedisServer(tls=True, password=PASSWORD) as srv:
        assert srv.url.startswith("rediss://") and "ssl_ca_certs=" in srv.url
        worker, client, ns = _score_through(srv.url, tmp_path, name="tls-worker")
        try:
            assert worker.terminate() == 0
            assert all(s not in worker.log() for s in _secret_forms(PASSWORD))
        finally:
            worker.kill()
            client.close()
        # the server speaks TLS only: plain redis:// fails, and so does TLS without the CA
        plain = srv.url.replace("rediss://", "redis://").split("?")[0]
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(plain, socket_connect_timeout=2, socket_timeout=2).ping()
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            redis.Redis.from_url(srv.url.split("?")[0], socket_connect_timeout=2).ping()


def test_redact_url_hides_every_password_form() -> None:
    assert redact_url("redis://u:p@ss@h:1/0") == "redis://u:***@h:1/0"
    assert redact_url("rediss://:s%40x@h/0?ssl_ca_certs=/ca.pem") == "rediss://:***@h/0?ssl_ca_certs=/ca.pem"
    assert redact_url("redis://h:6379/0?db=1&password=secret") == "redis://h:6379/0?db=1&password=***"
    assert redact_url("redis+cluster://:pw@h:7000") == "redis+cluster://:***@h:7000"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"


# ------------------------------------------------------------------------------------------
# no pickle; bounded decoding
# ------------------------------------------------------------------------------------------

UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal", "joblib"}
UNSAFE_CALLS = {("torch", "load"), ("pickle", "loads"), ("yaml", "load"), ("yaml", "unsafe_load")}


def test_no_module_imports_pickle_or_calls_an_unsafe_loader() -> None:
    offenders = []
    files = sorted((REPO / "rewardq").rglob("*.py"))
    assert len(files) > 20
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            offenders += [f"{path.relative_to(REPO)}: imports {n}" for n in names if n in UNSAFE_MODULES]
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and (node.func.value.id, node.func.attr) in UNSAFE_CALLS
            ):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.func.value.id}.{node.func.attr}()")
            if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                offenders.append(f"{path.relative_to(REPO)}:{node.value.lineno}: allow_pickle=")
    assert not offenders, offenders


BOMBS = {
    "array32 of 4 billion": b"\xdd\xff\xff\xff\xff",
    "map32 of 4 billion": b"\xdf\xff\xff\xff\xff",
    "str32 of 4 GB": b"\xdb\xff\xff\xff\xff" + b"a" * 16,
    "bin32 of 4 GB": b"\xc6\xff\xff\xff\xff" + b"a" * 16,
    "ext32 of 4 GB": b"\xc9\xff\xff\xff\xff\x01" + b"a" * 16,
    "200k nested arrays": b"\x91" * 200_000 + b"\xc0",
    "field holding a huge array": b"\x82\xa1v\x01\xa6sample\xdd\xff\xff\xff\xff",
    "unknown ext type": msgpack.packb({"v": 1, "prompt_ids": msgpack.ExtType(99, b"abcd")}),
    "empty": b"",
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_msgpack_bombs_are_refused_without_big_allocations(name: Any) -> None:
    data = BOMBS[name]
    tracemalloc.start()
    try:
        with pytest.raises(RecordError):
            decode_output(data)
        assert peek_identity(data) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, f"{name}: {peak} bytes allocated"


def test_oversize_records_are_refused_before_decoding() -> None:
    big = encode_output(
        "big",
        "s",
        0,
        {"prompt_ids": np.arange(2_000_000) % 1000, "response_ids": [1]},
        {},
        final=True,
        max_bytes=1 << 30,
    )
    tracemalloc.start()
    try:
        with pytest.raises(RecordError, match="max_record_bytes=1048576"):
            decode_output(big, max_bytes=1 << 20)
        assert peek_identity(big) == ("big", "s", 0)  # the identity is read from the first bytes only
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(big) > 8_000_000 and peak < 1_000_000, peak


def test_bombs_cannot_allocate_even_under_a_hard_memory_cap() -> None:
    """In a child whose address space may grow by only 256 MB, every bomb is a RecordError."""
    code = """
import resource, sys
import msgpack
from rewardq.queue.codec import decode_output, peek_identity
from rewardq.errors import RecordError
bombs = msgpack.unpackb(sys.stdin.buffer.read(), raw=False)
with open("/proc/self/statm") as f:
    vm = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
for name, data in bombs.items():
    try:
        decode_output(data)
        print("ACCEPTED", name)
    except RecordError:
        print("refused", name)
    peek_identity(data)
print("done")
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=msgpack.packb(BOMBS, use_bin_type=True),
        capture_output=True,
        timeout=120,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"},
    )
    stdout = out.stdout.decode()
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert stdout.count("refused") == len(BOMBS) and stdout.strip().endswith("done"), stdout


def test_records_never_make_a_worker_import_code(
    tmp_path: Path, redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    """Data sources, reward functions and managers come from the worker's configuration only:
    a record naming a module gets an "unknown data source" error, and nothing is imported."""
    canary = tmp_path / "canary"
    ks = Keyspace(ns)
    client = RewardClient.from_url(redis_url, namespace=ns)
    names = [
        "tests.support.import_canary",
        "tests.support.import_canary:compute_score",
        "tests/support/import_canary.py",
    ]
    keys = []
    for i, name in enumerate(names):
        sample = {
            "data_source": name,
            "reward_model": {"ground_truth": "1"},
            "extra_info": {"reward_fn": name, "manager": name, "custom_reward_function": {"path": name}},
        }
        keys += client.put_trajectory(f"c{i}", "s", [{"prompt_ids": [1, 2], "response_ids": [3, 4]}], sample)
    # a bomb and an oversize record straight into the stream, bypassing the producer's checks
    sync_redis.xadd(ks.stream(0), {"key": "bomb_s_0", "data": BOMBS["array32 of 4 billion"]})
    big = encode_output(
        "big", "s", 0, {"prompt_ids": np.arange(300_000) % 1000, "response_ids": [1]}, {}, final=True, max_bytes=1 << 30
    )
    sync_redis.xadd(ks.stream(0), {"key": "big_s_0", "data": big})
    worker = WorkerProcess(
        redis_url,
        ns,
        cli=True,
        log_dir=tmp_path,
        name="canary-w",
        manager="naive",
        max_record_bytes=1 << 20,
        env={"REWARDQ_TEST_CANARY": str(canary)},
        heartbeat_interval=0.3,
        lease_seconds=1.5,
        maintenance_interval=0.3,
    )
    try:
        assert worker.wait_for_log("worker canary-w started", START_TIMEOUT), worker.log()
        res = client.wait_rewards(keys + ["big_s_0"], timeout=60)
        for k in keys:
            assert res[k].status == "error" and "data_source" in (res[k].error or "").lower(), res[k].error
        assert res["big_s_0"].status == "error" and "max_record_bytes=1048576" in (res["big_s_0"].error or "")
        deadline = time.monotonic() + 30
        while sync_redis.xlen(ks.stream(0)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sync_redis.xlen(ks.stream(0)) == 0  # the bomb was dead-lettered, not left to loop
        kinds = sorted(f[b"kind"] for _, f in sync_redis.xrange(ks.dead(0)))
        assert kinds.count(b"invalid") == 2, kinds
        assert worker.alive()
        assert worker.terminate() == 0
    finally:
        worker.kill()
        client.close()
    assert not canary.exists(), canary.read_text()
