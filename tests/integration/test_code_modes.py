"""The local code sandbox in every mode this host can run, through real worker processes.

In each mode a correct program that imports numpy or the standard library scores what verl's
``prime_code`` scores (1.0), the worker's secret files (the Redis URL file, the config file: both
world-readable here, as a Kubernetes secret is by default) stay unreadable, and UDP is refused;
or the worker refuses at start-up, naming the fix, and code trajectories get error results of
failure kind ``config``, never a 0.0:

* ``namespaces`` (root): the interpreter under a 0700 ``/root`` (pyenv) is bound back read-only,
  the secrets are covered; ``assert_case`` problems score as SandboxFusion would, and every known
  hack trips its wire (counted in ``rewardq status`` and ``/metrics``);
* ``namespaces`` with the interpreter in a venv under ``/tmp`` (which jobs see as a fresh tmpfs);
* ``rlimits`` as root with an interpreter every user can read: works, and refuses a secret other
  users can read;
* ``rlimits`` as root with the interpreter under a 0700 folder: refuses at start.

``rlimits`` as another user (Landlock) is ``tests/integration/test_code_nonroot.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewardq import FailureKind, RewardClient
from tests.support.assert_cases import HACKS, HONEST, REFUSED, AssertCase
from tests.support.cli_procs import Proc, Procs, wait_for
from tests.support.code_probes import ASSERT_SUBSET, import_probes
from tests.support.records import text_output
from tests.support.redis_server import RedisServer
from tests.support.sandbox_hosts import closed_interpreter, readable_interpreter

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and util-linux"),
]

HEAD, TAIL = f"pw{uuid.uuid4().hex[:10]}", uuid.uuid4().hex[:10]
PASSWORD = HEAD + TAIL  # no program's source holds it in one piece


@pytest.fixture
def secret_dir() -> Iterator[Path]:
    """A folder every job can see (not under /tmp, /root or /home, which jobs never see)."""
    d = Path(f"/var/lib/rewardq-test-{uuid.uuid4().hex[:8]}")
    d.mkdir(mode=0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD) as srv:
        yield srv


@pytest.fixture
def udp_listener() -> Iterator[tuple[int, socket.socket]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        yield sock.getsockname()[1], sock
    finally:
        sock.close()


def _secrets(d: Path, url: str, ns: str, mode: int) -> tuple[Path, Path]:
    url_file, config = d / "redis-url", d / "rewardq.json"
    url_file.write_text(url + "\n")
    config.write_text(json.dumps({"redis_url": url, "namespace": ns}))  # a password in the config file too
    for f in (url_file, config):
        f.chmod(mode)
    return url_file, config


def _start(
    procs: Procs,
    ns: str,
    name: str,
    config: Path,
    url_file: Path,
    *options: str,
    prefix: list[str] | None = None,
    python: str = sys.executable,
) -> Proc:
    """A worker reading its Redis URL from ``url_file`` (the URL is on no command line) and ``config``."""
    args = ["worker", "--config", str(config), "--namespace", ns, "--tokenizer", "builtin:demo", "--name", name]
    args += ["--log-level", "INFO", "--metrics-port", "0"]
    for option in ("code_local_max_concurrent=2", "code_local_case_timeout=5", *options):
        args += ["--manager-option", option]
    env = {"REWARDQ_REDIS_URL_FILE": str(url_file)}
    return procs.start(args, env=env, tag=name, prefix=prefix or [], python=python)


def _put(client: RewardClient, uid: str, program: str, ground_truth: dict[str, Any]) -> str:
    sample = {"data_source": "codecontests", "reward_model": {"ground_truth": json.dumps(ground_truth)}}
    text = f"```python\n{program}\n```"
    return client.put_trajectory(uid, "0", [text_output(text, "Solve it.")], {**sample, "extra_info": {}})[0]


def _score_probes(client: RewardClient, probes: dict[str, tuple[str, str]]) -> dict[str, Any]:
    keys = {
        n: _put(client, f"p-{n}", prog, {"inputs": ["4\n"], "outputs": [out + "\n"]})
        for n, (prog, out) in probes.items()
    }
    res = client.wait_rewards(list(keys.values()), timeout=300)
    return {n: res[k] for n, k in keys.items()}


def _assert_probes_pass(got: dict[str, Any]) -> None:
    bad = {
        n: (r.status, r.reward_score, r.reward_extra_info, r.error)
        for n, r in got.items()
        if not (r.ok and r.reward_score == 1.0)
    }
    assert not bad, json.dumps(bad, indent=1, default=str)


def _score_cases(client: RewardClient, cases: list[AssertCase]) -> dict[str, Any]:
    keys = {c.name: _put(client, f"a-{c.name}", c.program, c.ground_truth) for c in cases}
    res = client.wait_rewards(list(keys.values()), timeout=400)
    return {c.name: res[keys[c.name]] for c in cases}


def _assert_cases_scored(cases: list[AssertCase], got: dict[str, Any]) -> None:
    wrong = {
        c.name: (got[c.name].reward_score, got[c.name].reward_extra_info)
        for c in cases
        if not (
            got[c.name].ok
            and got[c.name].reward_score == pytest.approx(c.score)
            and got[c.name].reward_extra_info["tripwire"] == c.tripwire
        )
    }
    assert not wrong, json.dumps(wrong, indent=1, default=str)


def _refused(client: RewardClient, fixes: tuple[str, ...]) -> None:
    """A correct program that imports ``array`` gets an error result of kind ``config`` naming ``fixes``."""
    key = _put(client, "refused", "import array\nprint(int(input()) ** 2)", {"inputs": ["4\n"], "outputs": ["16\n"]})
    res = client.wait_rewards([key], timeout=300)[key]
    assert res.status == "error" and res.failure_kind == FailureKind.CONFIG, res
    for fix in fixes:
        assert fix in (res.error or ""), res.error


def test_namespaces_run_imports_hide_secrets_and_catch_every_hack(
    procs: Procs, ns: str, server: RedisServer, secret_dir: Path, udp_listener: tuple[int, socket.socket]
) -> None:
    # Given a root worker with the default isolation; its URL and config files readable by everyone
    url = server.url_for(password=PASSWORD)
    url_file, config = _secrets(secret_dir, url, ns, 0o644)
    worker = _start(procs, ns, "ns-w", config, url_file)
    client = RewardClient.from_url(url, namespace=ns)
    port, listener = udp_listener
    # When programs that import numpy and the standard library, read the secrets and send UDP arrive
    got = _score_probes(client, import_probes([str(url_file), str(config)], port, HEAD, TAIL))
    # Then each scores 1.0: imports work, the secrets read as empty files, UDP is refused
    _assert_probes_pass(got)
    with pytest.raises(BlockingIOError):
        listener.recv(64)
    # And assert_case problems: honest solutions score as SandboxFusion would, every hack 0.0 by name
    cases = HONEST + HACKS + REFUSED
    _assert_cases_scored(cases, _score_cases(client, cases))
    assert "local code runner: namespaces" in worker.stderr()
    # ... counted per data source in `rewardq status` and on /metrics
    wires: dict[str, int] = {}
    for c in HACKS:
        wires[c.tripwire] = wires.get(c.tripwire, 0) + 1

    def published() -> dict[str, int]:
        raw = server.client().hget(f"{ns}:worker:ns-w", "code")
        return dict(json.loads(raw)["codecontests"].get("tripwires", {})) if raw else {}

    wait_for(lambda: published() == wires, 30, "tripwire counts in the heartbeat", procs=[worker])
    code, st = procs.run(["status", "--namespace", ns, "--json"], env={"REWARDQ_REDIS_URL": url}, tag="status")
    assert code == 0, st.stderr()
    assert json.loads(st.stdout())["code"]["codecontests"]["tripwires"] == wires
    port_m = int(re.search(r"metrics on http://0\.0\.0\.0:(\d+)/metrics", worker.stderr()).group(1))  # type: ignore[union-attr]  # logged at start
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port_m}/metrics", timeout=10).read().decode()
    series = 'rewardq_code_tripwires_total{backend="local",data_source="codecontests",tripwire="early_exit"}'
    assert f"{series} {float(wires['early_exit'])}" in metrics
    assert PASSWORD not in json.dumps([r.reward_extra_info for r in got.values()])
    client.close()
    assert worker.terminate() == 0, worker.stderr()[-3000:]


def _tmp_venv(tmp: Path) -> Path:
    """A venv under /tmp holding numpy itself (the worker's other packages through a .pth file)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python*/site-packages"))
    import numpy

    source = Path(numpy.__file__).parent
    for name in ("numpy", "numpy.libs"):
        if (source.parent / name).exists():
            shutil.copytree(source.parent / name, site / name, symlinks=True)
    (site / "zz_worker.pth").write_text(str(source.parent) + "\n")
    return venv / "bin" / "python"


def test_namespaces_with_the_interpreter_in_a_venv_under_tmp(
    procs: Procs, ns: str, server: RedisServer, secret_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("numpy")
    # Given a worker whose interpreter is a venv under /tmp (jobs get a fresh /tmp), numpy in it
    python = _tmp_venv(tmp_path)
    check = f"import numpy; assert numpy.__file__.startswith({str(tmp_path)!r}), numpy.__file__"
    subprocess.run([str(python), "-c", check], check=True, timeout=60)
    url = server.url_for(password=PASSWORD)
    url_file, config = _secrets(secret_dir, url, ns, 0o600)
    worker = _start(procs, ns, "tmpvenv-w", config, url_file, python=str(python))
    client = RewardClient.from_url(url, namespace=ns)
    # When a numpy program arrives, Then it scores 1.0 (the venv is bound back into the job's /tmp)
    probes = import_probes([], 9, HEAD, TAIL)
    _assert_probes_pass(_score_probes(client, {k: probes[k] for k in ("numpy", "numpy-lazy-submodule", "array")}))
    client.close()
    assert worker.terminate() == 0, worker.stderr()[-3000:]


def test_rlimits_as_root_with_a_readable_interpreter_runs_imports_and_keeps_secrets(
    procs: Procs, ns: str, server: RedisServer, secret_dir: Path, udp_listener: tuple[int, socket.socket]
) -> None:
    # Given rlimits as root, the interpreter where every user can read it, the secrets root's 0600
    url = server.url_for(password=PASSWORD)
    url_file, config = _secrets(secret_dir, url, ns, 0o600)
    worker = _start(
        procs, ns, "rl-w", config, url_file, "code_local_isolation=rlimits", prefix=readable_interpreter([])
    )
    client = RewardClient.from_url(url, namespace=ns)
    port, listener = udp_listener
    # When the same programs arrive, Then each scores 1.0 (the job's own uid cannot read a 0600 secret)
    _assert_probes_pass(_score_probes(client, import_probes([str(url_file), str(config)], port, HEAD, TAIL)))
    with pytest.raises(BlockingIOError):
        listener.recv(64)
    # ... and assert_case problems with their hacks score as in namespaces
    cases = [c for c in HONEST + HACKS if c.name in ASSERT_SUBSET]
    _assert_cases_scored(cases, _score_cases(client, cases))
    assert "code_local_isolation=rlimits" in worker.stderr()
    client.close()
    assert worker.terminate() == 0, worker.stderr()[-3000:]


def test_rlimits_as_root_refuses_a_secret_other_users_can_read(
    procs: Procs, ns: str, server: RedisServer, secret_dir: Path
) -> None:
    # Given rlimits as root with a readable interpreter, and a URL file every user can read (0644)
    url = server.url_for(password=PASSWORD)
    url_file, config = _secrets(secret_dir, url, ns, 0o644)
    worker = _start(
        procs, ns, "rl-open", config, url_file, "code_local_isolation=rlimits", prefix=readable_interpreter([])
    )
    client = RewardClient.from_url(url, namespace=ns)
    # Then code trajectories get config error results naming the file and the fix
    _refused(client, (str(url_file), "readable by other users", "chmod 600"))
    # ... and the worker said so at start-up
    wait_for(lambda: "will get error results" in worker.stderr(), 30, "the refusal in the log", procs=[worker])
    client.close()
    assert worker.terminate() == 0, worker.stderr()[-3000:]


@pytest.mark.skipif(closed_interpreter() is None, reason="the interpreter is readable by every user here")
def test_rlimits_as_root_refuses_an_interpreter_under_a_closed_home(
    procs: Procs, ns: str, server: RedisServer, secret_dir: Path
) -> None:
    # Given rlimits as root on this host as it is: the interpreter under a 0700 folder (pyenv in /root)
    url = server.url_for(password=PASSWORD)
    url_file, config = _secrets(secret_dir, url, ns, 0o600)
    worker = _start(procs, ns, "rl-closed", config, url_file, "code_local_isolation=rlimits")
    client = RewardClient.from_url(url, namespace=ns)
    # Then `import array` is never scored 0.0: an error result of kind config with the fix
    closed = closed_interpreter()
    _refused(client, (f"{closed} is closed to other users", "install the interpreter", "sandbox_fusion_url"))
    log = worker.stderr()
    assert "will get error results" in log and f"{closed} is closed to other users" in log
    client.close()
    assert worker.terminate() == 0, worker.stderr()[-3000:]


def test_namespaces_refuse_an_interpreter_whose_files_other_users_cannot_read(
    procs: Procs, ns: str, server: RedisServer, secret_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("numpy")
    # Given a venv whose numpy only root may read (installed with umask 077): nothing visible says so
    python = _tmp_venv(tmp_path)
    next((tmp_path / "venv").glob("lib/python*/site-packages/numpy/__init__.py")).chmod(0o600)
    url = server.url_for(password=PASSWORD)
    url_file, config = _secrets(secret_dir, url, ns, 0o600)
    worker = _start(procs, ns, "unreadable-w", config, url_file, python=str(python))
    client = RewardClient.from_url(url, namespace=ns)
    # Then the start-up probe (numpy imported as a job's uid) fails: code is refused with the fix
    _refused(client, ("a correct program fails in it", "numpy", "chmod -R o+rX"))
    log = worker.stderr()
    assert "will get error results" in log.split("worker unreadable-w started")[0], log[-3000:]
    client.close()
    assert worker.terminate() == 0, worker.stderr()[-3000:]


def test_namespaces_with_the_url_and_config_files_under_tmp(
    procs: Procs, ns: str, server: RedisServer, tmp_path: Path
) -> None:
    # Given a worker whose Redis URL file and config file lie under /tmp (a job's /tmp is a fresh
    # tmpfs, so they are gone there already: nothing is left to cover)
    assert str(tmp_path).startswith("/tmp/")
    url = server.url_for(password=PASSWORD)
    url_file, config = _secrets(tmp_path, url, ns, 0o600)
    worker = _start(procs, ns, "tmpsecret-w", config, url_file)
    client = RewardClient.from_url(url, namespace=ns)
    # When programs arrive, Then they run (no error result) and cannot read either file
    probes = import_probes([str(url_file), str(config)], 9, HEAD, TAIL)
    _assert_probes_pass(_score_probes(client, {k: probes[k] for k in ("numpy", "array", "secrets")}))
    client.close()
    assert worker.terminate() == 0, worker.stderr()[-3000:]
