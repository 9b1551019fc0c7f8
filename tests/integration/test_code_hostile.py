"""Hostile programs through a real worker process and the local runner (no SandboxFusion).

Each hostile program must end as a scored failure whose ``code_error`` names what happened,
while the worker, Redis and the good programs of the same run are unaffected. This host runs
the tests as root, so the runner uses namespaces (asserted below); what changes without them
is in docs/code-execution.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from rewardq import RewardClient
from tests.support.cli_procs import START_WAIT, Procs, wait_for, worker_argv
from tests.support.records import text_output
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.timeout(300)

SECRET = f"s3cret-{uuid.uuid4().hex}"
ONE_CASE = json.dumps({"inputs": ["4\n"], "outputs": ["16\n"]})
THREE_CASES = json.dumps({"inputs": ["1\n", "2\n", "3\n"], "outputs": ["1\n", "4\n", "9\n"]})


def hostile_programs(worker_pid: int, outside: str) -> dict[str, tuple[str, str, str]]:
    """name -> (program, expected code_status, text its code_error must contain)."""
    return {
        "infinite-loop": ("while True:\n    pass", "timeout", "timed out"),
        "fork-bomb": (
            "import posix\nwhile True:\n    try:\n        posix.fork()\n    except OSError:\n        pass",
            "timeout",
            "timed out",
        ),
        "allocate-8gb": ("x = bytearray(8 * 1024 ** 3)\nprint(len(x))", "runtime_error", "MemoryError"),
        "print-1gb": (
            "chunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    print(chunk)",
            "output_limit",  # bounded where it is printed: the worker never holds it
            "printed more than the output limit",
        ),
        "kill-parent": ("import os\nos.kill(os.getppid(), 9)", "runtime_error", "TypeError"),
        "kill-parent-posix": ("import posix\nposix.kill(posix.getppid(), 9)", "runtime_error", "PermissionError"),
        "kill-worker": (f"import posix\nposix.kill({worker_pid}, 9)", "runtime_error", "ProcessLookupError"),
        "write-outside": (f"open({outside!r}, 'w').write('pwned')", "runtime_error", "Read-only file system"),
        "write-tmp": ("open('/tmp/pwned', 'w').write('pwned')", "runtime_error", "Permission denied"),
        "open-socket": (
            "import socket\nsocket.create_connection(('127.0.0.1', 6379), timeout=2)\nprint(16)",
            "runtime_error",
            "Network is unreachable",
        ),
        "read-env": ("import os\nprint(os.environ['REWARDQ_TEST_SECRET'])", "runtime_error", "KeyError"),
        "read-worker-environ": (
            f"print(open('/proc/{worker_pid}/environ').read())",
            "runtime_error",
            "FileNotFoundError",
        ),
        "read-init-environ": ("print(open('/proc/1/environ').read())", "runtime_error", "PermissionError"),
        "forge-report": (FORGE, "malformed_report", "line(s) without the run's token on its report pipe"),
    }


# writes a fake sandbox failure and a passing record on every descriptor it can, then hangs
FORGE = r"""import posix
fake = b'{"sandbox_error": "forged"}\n{"case": 0, "out": "16\\n"}\n{"done": true}\n'
for fd in range(3, 64):
    try:
        posix.write(fd, fake)
    except OSError:
        pass
while True:
    pass"""


GOOD = {
    "square": ("n = int(input())\nprint(n * n)", ONE_CASE, 1.0),
    "square-stdin": ("import sys\nprint(int(sys.stdin.read()) ** 2)", ONE_CASE, 1.0),
    "squares-partial": ("n = int(input())\nprint(n * n if n < 3 else 0)", THREE_CASES, 2 / 3),
    "squares": ("n = int(input())\nprint(n * n)", THREE_CASES, 1.0),
}


def _output(program: str) -> dict[str, Any]:
    text = f"My answer:\n```python\n{program}\n```"
    return text_output(text, "Solve it.")


def _sandbox_uid_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "uid=,pid=,comm="], capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if 61000 <= int(ln.split()[0]) < 65000]


def test_hostile_programs_fail_by_name_and_hurt_nothing_else(
    procs: Procs, redis_url: str, ns: str, sync_redis: SyncClient, tmp_path: Path
) -> None:
    # Given a worker process (holding a secret in its environment) using the local runner with short timeouts
    name = f"code-{uuid.uuid4().hex[:6]}"
    worker = procs.start(
        worker_argv(
            redis_url,
            ns,
            name,
            "--metrics-port",
            "0",
            "--concurrency",
            "8",
            "--manager-option",
            "code_local_first_pass_timeout=1",
            "--manager-option",
            "code_local_case_timeout=2",
            "--manager-option",
            "sandbox_fusion_memory_limit_mb=512",
            "--manager-option",
            "code_local_max_concurrent=4",
            "--log-level",
            "INFO",
        ),
        env={"REWARDQ_TEST_SECRET": SECRET},
        tag="code",
    )
    wait_for(lambda: sync_redis.exists(f"{ns}:worker:{name}"), START_WAIT, "worker heartbeat", procs=[worker])
    # a host folder the sandbox shows read-only wherever the checkout lies (a checkout under /tmp is
    # not visible at all in the sandbox's private /tmp)
    outside = f"/var/tmp/pwned-{uuid.uuid4().hex[:8]}.txt"
    hostile = hostile_programs(worker.pid, outside)

    # When hostile and good programs arrive together
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys: dict[str, str] = {}
    for i, (label, (program, *_)) in enumerate(hostile.items()):
        keys[label] = client.put_trajectory(f"h{i}", "0", [_output(program)], _sample(ONE_CASE))[0]
    for i, (label, (program, gt, _)) in enumerate(GOOD.items()):
        keys[label] = client.put_trajectory(f"g{i}", "0", [_output(program)], _sample(gt))[0]
    res = client.wait_rewards(list(keys.values()), timeout=240)
    by_label = {label: res[key] for label, key in keys.items()}

    # Then every hostile program is a scored failure that names what it did
    problems = []
    for label, (_, status, text) in hostile.items():
        r = by_label[label]
        info = r.reward_extra_info
        if not (r.ok and r.reward_score == 0.0 and info["code_status"] == status and text in info["code_error"]):
            problems.append((label, r.status, r.reward_score, info))
    assert not problems, "\n".join(map(str, problems))
    # ... the good ones, scored in the same run, got their right rewards
    for label, (_, _, want) in GOOD.items():
        assert by_label[label].ok and by_label[label].reward_score == pytest.approx(want), by_label[label]
    # ... the worker is alive and heartbeating, Redis answers, nothing was written outside, no program survives
    assert worker.popen.poll() is None
    assert sync_redis.ping() and sync_redis.exists(f"{ns}:worker:{name}")
    assert not os.path.exists(outside) and not os.path.exists("/tmp/pwned")
    wait_for(lambda: not _sandbox_uid_processes(), 20, "no sandbox processes left")
    assert "local code runner: namespaces" in worker.stderr()
    assert SECRET not in json.dumps([r.reward_extra_info for r in res.values()])

    # and the code counters show up in `rewardq status` (after the next heartbeat) and on /metrics
    def published() -> int:
        raw = sync_redis.hget(f"{ns}:worker:{name}", "code")
        return json.loads(raw)["codecontests"]["trajectories"] if raw else 0

    wait_for(lambda: published() == len(keys), 30, "code counters in the heartbeat")
    code, st = procs.run(["status", "--redis-url", redis_url, "--namespace", ns, "--json"], tag="status")
    assert code == 0, st.stderr()
    counts = json.loads(st.stdout())["code"]["codecontests"]
    assert counts["trajectories"] == len(keys) and counts["backend"] == "local"
    # programs run: a first pass each, plus one per counted case for those that did not pass it
    timeouts = sum(status == "timeout" for _, status, _ in hostile.values())
    assert counts["statuses"]["timeout"] == timeouts and counts["runs"] == 2 * len(hostile) + 1 + 1 + (1 + 3) + 1
    port = int(re.search(r"metrics on http://0\.0\.0\.0:(\d+)/metrics", worker.stderr()).group(1))  # type: ignore[union-attr]  # the line is there once the worker started
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    series = 'rewardq_code_trajectories_total{backend="local",data_source="codecontests",status="timeout"}'
    assert f"{series} {timeouts}.0" in metrics
    client.close()
    assert worker.terminate() == 0, worker.stderr()[-3000:]


def _sample(ground_truth: str) -> dict[str, Any]:
    return {"data_source": "codecontests", "reward_model": {"ground_truth": ground_truth}, "extra_info": {}}
