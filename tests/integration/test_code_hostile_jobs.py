"""Hostile programs beside correct ones in ONE worker, every outcome exact (issue 23's suite).

* **Cross-job interference**: a fork bomb whose children ``setsid()`` and spin with SIGALRM
  ignored, and a program forking 8 children of 900 MB each, run next to correct programs
  that need 3 s of CPU each; the correct ones score 1.0, and the host never lends the forker
  more than its job's memory.
* **Outcome forgery**: ``raise ValueError('\\ud800')`` and ``b'[' * 200000`` written on every
  descriptor score 0.0 as failing programs do, with no dead letter and no error result.
* **Leaks**: ``oom_score_adj`` reads 1000 in a program and in its child; a Unix socket
  listening at a world-connectable path is unreachable; a key one job writes to its keyring
  is invisible to the next; no user namespace can be made inside.

This host runs the tests as root, so the runner uses namespaces with a cgroup per job.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from tests.support.cli_procs import START_WAIT, Procs, wait_for, worker_argv
from tests.support.records import text_output
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.timeout(420)

ONE_CASE = json.dumps({"inputs": ["4\n"], "outputs": ["16\n"]})
CPU_3S = "import time\nt = time.process_time()\nwhile time.process_time() - t < 3:\n    pass\nprint(int(input()) ** 2)"

SETSID_SPINNER = r"""import posix, signal
signal.signal(signal.SIGALRM, signal.SIG_IGN)
for _ in range(64):
    try:
        if posix.fork() == 0:
            posix.setsid()
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
            while True:
                pass
    except OSError:
        break
while True:
    pass"""

FORKER_8X900 = r"""import posix, time
kids = []
for _ in range(8):
    pid = posix.fork()
    if pid == 0:
        block = b'\x01' * (900 * 1024 * 1024)
        while True:
            time.sleep(1)
    kids.append(pid)
while True:
    time.sleep(1)"""

FORGE_BRACKETS = r"""import posix
for fd in range(3, 256):
    try:
        posix.write(fd, b'[' * 200000 + b'\n')
    except OSError:
        pass
print(int(input()) ** 2)"""

OOM_ADJ = r"""import posix
def adj():
    return open('/proc/self/oom_score_adj').read().strip()
r, w = posix.pipe()
pid = posix.fork()
if pid == 0:
    posix.write(w, adj().encode())
    posix._exit(0)
posix.waitpid(pid, 0)
print(adj(), posix.read(r, 16).decode())"""

KEY_WRITER = r"""del sys.modules['ctypes']
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
# add_key("user", "rewardq-leak", "secret", 6, KEY_SPEC_USER_KEYRING) and the session keyring
for ring in (-4, -3):
    libc.syscall(248, b"user", b"rewardq-leak", b"secret", 6, ring)
print("written")"""

KEY_READER = r"""del sys.modules['ctypes']
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
found = []
for ring in (-4, -3):  # keyctl(KEYCTL_SEARCH, ring, "user", "rewardq-leak", 0)
    if libc.syscall(250, 10, ring, b"user", b"rewardq-leak", 0) > 0:
        found.append(ring)
try:
    if "rewardq-leak" in open('/proc/keys').read():
        found.append('proc')
except OSError:
    pass
print("found" if found else "invisible")"""

USERNS = r"""del sys.modules['ctypes']
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("refused" if libc.unshare(0x10000000) != 0 else "made")"""


def unix_probe(path: str) -> str:
    return (
        "import socket\n"
        "try:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        f"    s.connect({path!r})\n"
        "    s.sendall(b'PING')\n"
        "    print('reached', s.recv(16))\n"
        "except OSError as exc:\n"
        "    print('unreachable')"
    )


def _sample(outputs: list[str]) -> dict[str, Any]:
    gt = json.dumps({"inputs": ["4\n"], "outputs": outputs})
    return {"data_source": "codecontests", "reward_model": {"ground_truth": gt}, "extra_info": {}}


def _peak_memory(worker_pid: int) -> int:
    """High-water mark of all the worker's job cgroups together (v1 ``max_usage`` or v2 ``peak``)."""
    for base in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup"):
        for root, dirs, files in os.walk(base):
            if os.path.basename(root) == f"rewardq-{worker_pid}":
                for name in ("memory.max_usage_in_bytes", "memory.peak"):
                    if name in files:
                        with open(os.path.join(root, name)) as f:
                            return int(f.read())
            if root.count("/") > 8:
                dirs[:] = []
    raise AssertionError("the worker's cgroup folder was not found")


@pytest.fixture
def unix_listener() -> Iterator[tuple[str, list[bytes]]]:
    """A Unix socket anyone may connect to, at a world-writable path, answering PONG."""
    path = f"/var/tmp/rewardq-probe-{uuid.uuid4().hex[:8]}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(8)
    server.settimeout(0.5)
    hits: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            hits.append(conn.recv(16))
            conn.sendall(b"PONG")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    # the listener works from outside the sandbox
    probe = socket.socket(socket.AF_UNIX)
    probe.connect(path)
    probe.sendall(b"SELF")
    assert probe.recv(16) == b"PONG"
    probe.close()
    hits.clear()
    yield path, hits
    stop.set()
    thread.join(5)
    server.close()
    os.unlink(path)


def test_hostile_jobs_beside_correct_ones_change_nothing_but_their_own_score(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, unix_listener: tuple[str, list[bytes]]
) -> None:
    sock_path, socket_hits = unix_listener
    assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o777
    # Given one worker with the default timeouts (5 s per case, then 10 s) and 4 sandboxes at once
    name = f"hostile-{uuid.uuid4().hex[:6]}"
    worker = procs.start(
        worker_argv(redis_url, ns, name, "--concurrency", "16", "--manager-option", "code_local_max_concurrent=4"),
        tag="hostile",
    )
    wait_for(lambda: sync_redis.exists(f"{ns}:worker:{name}"), START_WAIT, "worker heartbeat", procs=[worker])
    client = RewardClient.from_url(redis_url, namespace=ns)

    # When the hostile programs and correct 3 s programs arrive together (the first four start at once)
    cases: dict[str, tuple[str, list[str], float]] = {
        "setsid-spinner": (SETSID_SPINNER, ["16\n"], 0.0),
        "forker-8x900MB": (FORKER_8X900, ["16\n"], 0.0),
        "correct-3s-a": (CPU_3S, ["16\n"], 1.0),
        "correct-3s-b": (CPU_3S, ["16\n"], 1.0),
        "lone-surrogate": ("raise ValueError('\\ud800')", ["16\n"], 0.0),
        "forged-brackets": (FORGE_BRACKETS, ["16\n"], 0.0),
        "oom-score-adj": (OOM_ADJ, ["1000 1000\n"], 1.0),
        "unix-socket": (unix_probe(sock_path), ["unreachable\n"], 1.0),
        "user-namespace": (USERNS, ["refused\n"], 1.0),
        "keyring-writer": (KEY_WRITER, ["written\n"], 1.0),
        "correct-3s-c": (CPU_3S, ["16\n"], 1.0),
    }
    keys = {}
    for i, (label, (program, outputs, _)) in enumerate(cases.items()):
        text = f"```python\n{program}\n```"
        keys[label] = client.put_trajectory(f"u{i}", "0", [text_output(text, "Solve it.")], _sample(outputs))[0]
    res = client.wait_rewards(list(keys.values()), timeout=300)
    # ... and a job reads the keyring after the writer's job has ended
    reader = f"```python\n{KEY_READER}\n```"
    [reader_key] = client.put_trajectory("reader", "0", [text_output(reader, "Solve it.")], _sample(["invisible\n"]))
    res.update(client.wait_rewards([reader_key], timeout=120))
    keys["keyring-reader"] = reader_key
    cases["keyring-reader"] = (KEY_READER, ["invisible\n"], 1.0)

    # Then every outcome is exact: each program scored, none an error, the correct ones 1.0
    got = {label: res[key] for label, key in keys.items()}
    wrong = {
        label: (r.status, r.reward_score, r.reward_extra_info)
        for label, r in got.items()
        if not (r.ok and r.reward_score == pytest.approx(cases[label][2]))
    }
    assert not wrong, json.dumps(wrong, indent=1, default=str)
    info = {label: r.reward_extra_info for label, r in got.items()}
    assert info["lone-surrogate"]["code_status"] == "runtime_error"
    assert info["lone-surrogate"]["code_error"] == "case 0: ValueError: \ufffd"
    assert info["forged-brackets"]["code_status"] == "malformed_report"
    assert info["setsid-spinner"]["code_status"] == "timeout"
    assert info["forker-8x900MB"]["code_status"] in ("timeout", "killed")
    # ... no dead letter, nothing reached the socket
    shards = Keyspace(ns)
    assert sum(sync_redis.xlen(shards.dead(s)) for s in range(shards.shards)) == 0
    assert socket_hits == []
    # ... the forker never held more than its job's memory: all jobs together stayed far below 8 x 900 MB
    peak = _peak_memory(worker.pid)
    assert peak < 4 * (1024 + 64) * 1024 * 1024, f"{peak / 2**20:.0f} MiB"
    assert worker.popen.poll() is None
    client.close()
    assert worker.terminate() == 0, worker.stderr()[-3000:]
