"""The shipped container's way of running the worker, without a Docker engine.

There is no Docker engine on this machine kind, so the image is never built or started here
(``.ci/run`` says so). What can be checked without one is checked: the worker is started the
way the image starts it (``docker/entrypoint.sh``, as root) with exactly the capabilities
``docker-compose.yml`` grants (every other one dropped from the bounding set, as
``cap_drop: [ALL]`` + ``cap_add`` does), and must run the namespaces mode: a correct program
scores 1.0, the isolation holds (``oom_score_adj`` 1000, a ``setsid`` spinner times out), and
with one capability less the worker refuses code naming the fix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from rewardq import RewardClient
from tests.support.cli_procs import REPO, START_WAIT, wait_for
from tests.support.records import text_output
from tests.support.sync_client import SyncClient

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="the container runs the worker as root"),
]

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
WORKER = COMPOSE["services"]["worker"]
OOM = "print(open('/proc/self/oom_score_adj').read().strip(), int(input()) ** 2)"
SPINNER = (
    "import posix, signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
    "for _ in range(8):\n    if posix.fork() == 0:\n        posix.setsid()\n        while True:\n            pass\n"
    "while True:\n    pass"
)


def test_the_image_runs_the_entrypoint_as_root_with_the_compose_capabilities() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["rewardq-entrypoint"\]', dockerfile, re.M)
    assert "COPY docker/entrypoint.sh /usr/local/bin/rewardq-entrypoint" in dockerfile
    assert not re.search(r"^USER ", dockerfile, re.M)  # root in the container, with few capabilities
    assert WORKER["user"] == "root" and WORKER["cap_drop"] == ["ALL"]
    assert "apparmor:unconfined" in WORKER["security_opt"]


def _start(tmp: Path, caps: list[str], redis_url: str, ns: str, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    bounding = ",".join(["-all", *(f"+{c.lower()}" for c in caps)])
    log = tmp / f"{name}.err"
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": str(REPO),
        "REWARDQ_REDIS_URL": redis_url,
        "LANG": "C.UTF-8",
    }
    args = ["worker", "--namespace", ns, "--tokenizer", "builtin:demo", "--name", name]
    args += ["--manager-option", "code_local_first_pass_timeout=1", "--manager-option", "code_local_case_timeout=1"]
    with open(log, "wb") as err:
        popen = subprocess.Popen(
            ["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", "sh", str(REPO / "docker/entrypoint.sh")]
            + args,
            stdout=subprocess.DEVNULL,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=str(tmp),
        )
    return popen, log


def _score(redis_url: str, ns: str, programs: dict[str, tuple[str, str]]) -> dict[str, Any]:
    client = RewardClient.from_url(redis_url, namespace=ns)
    keys = {}
    for i, (label, (program, expected)) in enumerate(programs.items()):
        gt = json.dumps({"inputs": ["4\n"], "outputs": [expected]})
        sample = {"data_source": "codecontests", "reward_model": {"ground_truth": gt}, "extra_info": {}}
        text = f"```python\n{program}\n```"
        keys[label] = client.put_trajectory(f"c{i}", "0", [text_output(text, "Solve it.")], sample)[0]
    res = client.wait_rewards(list(keys.values()), timeout=180)
    client.close()
    return {label: res[key] for label, key in keys.items()}


@pytest.mark.parametrize("drop", [None, "SYS_ADMIN"])
def test_the_entrypoint_with_the_compose_capabilities_runs_the_namespaces_mode(
    drop: str | None, redis_url: str, ns: str, sync_redis: SyncClient, tmp_path: Path
) -> None:
    caps = [c for c in WORKER["cap_add"] if c != drop]
    name = f"box-{uuid.uuid4().hex[:6]}"
    worker, log = _start(tmp_path, caps, redis_url, ns, name)
    try:
        wait_for(lambda: sync_redis.exists(f"{ns}:worker:{name}"), START_WAIT, "worker heartbeat")
        got = _score(redis_url, ns, {"correct": (OOM, "1000 16\n"), "spinner": (SPINNER, "16\n")})
    finally:
        worker.terminate()
        worker.wait(60)
    text = log.read_text()
    if drop is None:
        assert got["correct"].ok and got["correct"].reward_score == 1.0, got["correct"]
        assert got["spinner"].ok and got["spinner"].reward_extra_info["code_status"] == "timeout", got["spinner"]
        assert "local code runner: namespaces" in text, text[-2000:]
    else:  # one capability less: refused, never run with less isolation
        for r in got.values():
            assert r.status == "error" and "code_local_isolation=rlimits" in r.error, r
