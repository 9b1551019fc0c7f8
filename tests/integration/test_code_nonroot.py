"""Workers run by a real non-root user (made with ``useradd`` for the test, removed after it).

* With the default ``code_local_isolation=auto`` the worker refuses code data sources: their
  trajectories get an error result naming the fixes, and the worker says so at start-up.
* With an explicit ``rlimits`` (two worker processes under ``--processes``, the URL in
  ``REWARDQ_REDIS_URL_FILE``), a program hunting for the Redis password finds it nowhere it
  can read (every process's command line and environment, the URL file itself, the user's
  home, the worker's descriptors) and cannot talk to Redis; the programs still score right.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from rewardq import RewardClient
from tests.support.assert_cases import HACKS, HONEST
from tests.support.cli_procs import REPO, START_WAIT, wait_for
from tests.support.code_probes import ASSERT_SUBSET, import_probes
from tests.support.records import text_output
from tests.support.redis_server import RedisServer
from tests.support.sandbox_hosts import readable_interpreter

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"), reason="needs root to make a user"),
]

PASSWORD_HEAD, PASSWORD_TAIL = f"pw{uuid.uuid4().hex[:10]}", uuid.uuid4().hex[:10]
PASSWORD = PASSWORD_HEAD + PASSWORD_TAIL  # no program's source holds it in one piece


@pytest.fixture
def user(tmp_path: Path) -> Iterator[pwd.struct_passwd]:
    name = f"rq{uuid.uuid4().hex[:8]}"
    home = Path(f"/tmp/{name}-home")
    subprocess.run(["useradd", "--home-dir", str(home), "--create-home", "--shell", "/bin/sh", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)  # only this test's own user
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def _start_as(
    user: pwd.struct_passwd, tmp: Path, args: list[str], env: dict[str, str], tag: str
) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"{tag}.err"
    full = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": user.pw_dir,
        "PYTHONPATH": str(REPO),
        "LANG": "C.UTF-8",
        **env,
    }
    # The interpreter may live where the user cannot go (pyenv under /root, mode 0700): in a mount
    # namespace of the test's own it becomes readable, as a deployment installs the worker where its
    # user can run it.
    cmd = readable_interpreter([], user)
    with open(log, "wb") as err:
        popen = subprocess.Popen(
            [*cmd, sys.executable, "-m", "rewardq", *args],
            stdout=subprocess.DEVNULL,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=full,
            cwd=user.pw_dir,
        )
    return popen, log


def _stop(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(60)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(10)


def _put(client: RewardClient, uid: str, program: str, outputs: list[str]) -> str:
    return _put_gt(client, uid, program, {"inputs": ["4\n"], "outputs": outputs})


def _put_gt(client: RewardClient, uid: str, program: str, ground_truth: dict[str, Any]) -> str:
    sample = {"data_source": "codecontests", "reward_model": {"ground_truth": json.dumps(ground_truth)}}
    text = f"```python\n{program}\n```"
    return client.put_trajectory(uid, "0", [text_output(text, "Solve it.")], {**sample, "extra_info": {}})[0]


def test_auto_as_a_normal_user_refuses_code_naming_the_fix(user: pwd.struct_passwd, tmp_path: Path) -> None:
    with RedisServer(password=PASSWORD) as srv:
        url = srv.url_for(password=PASSWORD)
        ns = f"nr-{uuid.uuid4().hex[:6]}"
        worker, log = _start_as(
            user,
            tmp_path,
            ["worker", "--namespace", ns, "--tokenizer", "builtin:demo", "--name", "w"],
            {"REWARDQ_REDIS_URL": url},
            "auto",
        )
        try:
            r = redis.Redis.from_url(url)
            wait_for(lambda: r.exists(f"{ns}:worker:w"), START_WAIT, "worker heartbeat")
            client = RewardClient.from_url(url, namespace=ns)
            key = _put(client, "a", "print(int(input()) ** 2)", ["16\n"])
            [res] = client.wait_rewards([key], timeout=120).values()
            client.close()
        finally:
            _stop(worker)
    # the trajectory is not scored with weaker isolation: an error naming every fix
    assert res.status == "error", res
    for fix in ("not running as root", "capabilities", "sandbox_fusion_url", "code_local_isolation=rlimits"):
        assert fix in (res.error or ""), res.error
    # ... and the worker said so when it started, before any code arrived
    text = log.read_text()
    assert "will get error results" in text.split("scoring")[0] or "will get error results" in text


HUNTER = f"""import os, socket
pw = {PASSWORD_HEAD!r} + {PASSWORD_TAIL!r}
found = []
def look(path, data):
    if pw.encode() in data or b"redis://" in data:
        found.append(path)
def read(path):
    try:
        with open(path, "rb") as f:
            look(path, f.read(1 << 20))
    except OSError:
        pass
me = str(os.getpid())
try:
    pids = [p for p in os.listdir("/proc") if p.isdigit() and p != me]
except OSError:
    pids = []
for pid in pids:
    for what in ("cmdline", "environ"):
        read(f"/proc/{{pid}}/{{what}}")
    try:
        for fd in os.listdir(f"/proc/{{pid}}/fd"):
            read(f"/proc/{{pid}}/fd/{{fd}}")
    except OSError:
        pass
read(URL_FILE)
for top in (os.path.dirname(URL_FILE), "/tmp", "/etc"):
    for root, dirs, files in os.walk(top):
        for name in files[:200]:
            read(os.path.join(root, name))
try:
    s = socket.create_connection(("127.0.0.1", PORT), timeout=2)
    s.sendall(b"AUTH x\\r\\nPING\\r\\n")
    found.append("redis answered " + repr(s.recv(64)))
except OSError:
    pass
print("clean" if not found else "found " + " ".join(found)[:300])
"""


def test_rlimits_as_a_normal_user_hides_the_redis_password(user: pwd.struct_passwd, tmp_path: Path) -> None:
    url_file = Path(user.pw_dir) / "redis-url"
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.setblocking(False)
    udp_port = listener.getsockname()[1]
    with RedisServer(password=PASSWORD) as srv:
        url = srv.url_for(password=PASSWORD)
        url_file.write_text(url + "\n")
        os.chown(url_file, user.pw_uid, user.pw_gid)
        url_file.chmod(0o600)
        ns = f"nr-{uuid.uuid4().hex[:6]}"
        args = ["worker", "--namespace", ns, "--tokenizer", "builtin:demo", "--name", "w", "--processes", "2"]
        args += ["--manager-option", "code_local_isolation=rlimits", "--manager-option", "code_local_max_concurrent=2"]
        worker, log = _start_as(user, tmp_path, args, {"REWARDQ_REDIS_URL_FILE": str(url_file)}, "rlimits")
        try:
            r = redis.Redis.from_url(url)
            wait_for(
                lambda: r.exists(f"{ns}:worker:w-0") and r.exists(f"{ns}:worker:w-1"), START_WAIT, "worker heartbeats"
            )
            # no process of the user holds the password on its command line or in a readable environment
            for pid in subprocess.run(["pgrep", "-u", user.pw_name], capture_output=True, text=True).stdout.split():
                assert PASSWORD.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
            client = RewardClient.from_url(url, namespace=ns)
            hunter = HUNTER.replace("URL_FILE", repr(str(url_file))).replace("PORT", str(srv.port))
            keys = [_put(client, f"h{i}", hunter, ["clean\n"]) for i in range(2)]
            keys.append(_put(client, "ok", "print(int(input()) ** 2)", ["16\n"]))
            # correct programs importing numpy and the standard library, reading the URL file, sending UDP
            probes = import_probes([str(url_file)], udp_port, PASSWORD_HEAD, PASSWORD_TAIL)
            for name, (program, printed) in probes.items():
                keys.append(_put(client, f"p-{name}", program, [printed + "\n"]))
            cases = [c for c in HONEST + HACKS if c.name in ASSERT_SUBSET]
            asserted = {c.name: _put_gt(client, f"a-{c.name}", c.program, c.ground_truth) for c in cases}
            res = client.wait_rewards([*keys, *asserted.values()], timeout=400)
            client.close()
        finally:
            _stop(worker)
    for key in keys:
        assert res[key].ok and res[key].reward_score == 1.0, res[key]
    # assert_case problems score as with namespaces: honest ones right, each hack 0.0 by name
    for c in cases:
        got = res[asserted[c.name]]
        info = got.reward_extra_info
        assert got.ok and got.reward_score == pytest.approx(c.score) and info["tripwire"] == c.tripwire, (c.name, info)
    with pytest.raises(BlockingIOError):
        listener.recv(64)  # no datagram left the sandbox
    assert "code_local_isolation=rlimits" in log.read_text()  # the warning, at every start
