"""A test run that leaves a key in Redis fails, naming the key; concurrent runs never trip over each other.

Each case runs pytest in a subprocess on a one-test file, with ``tests/conftest.py`` as a plugin
(so the child claims a database of its own, as any run of the suite does), and without the
variables this run passes to its children (so the child does not simply reuse this run's database,
nor takes itself for one of this run's xdist workers).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import INHERITED
from tests.support.claimed_db import CLAIM_KEY
from tests.support.cli_procs import REPO
from tests.support.sync_client import SyncClient, connect

# One xdist worker runs these one after another: a child run claims the first free database, so a
# child of a test running beside another could take the database the other's child just released,
# and that test would read the new claim instead of the one its child ended.
pytestmark = pytest.mark.xdist_group("claimed-databases")

PROBE = """
import os, time
import redis

def test_probe(redis_url):
    r = redis.Redis.from_url(redis_url)
    r.set("leftover-probe", "x")
    if os.environ.get("PROBE_LEAVE") != "1":
        r.delete("leftover-probe")
    r.close()
    print("PROBE-URL", redis_url)
    time.sleep(float(os.environ.get("PROBE_SLEEP", "0")))
"""


def _child(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    return _pytest(tmp_path, ["-s", str(tmp_path / "test_probe.py")], env)


def _pytest(tmp_path: Path, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    own = ("REWARDQ_TEST_REDIS_URL", INHERITED)
    child_env = {k: v for k, v in os.environ.items() if k not in own and not k.startswith("PYTEST_XDIST")}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"]
        + ["--rootdir", str(tmp_path), "-c", os.devnull, *args],
        cwd=REPO,
        env={**child_env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(p: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, _ = p.communicate(timeout=180)
    found = re.search(r"PROBE-URL (\S+)", out)
    assert found, out
    return p.returncode, out, found.group(1)


def _assert_claim_ended(r: SyncClient, child_pid: int) -> None:
    """The child's claim ended: it reads ended, or another run (another test's child, or a developer's
    run) has taken the freed database since. It fails if the child's own claim still reads running."""
    claim = json.loads(r.get(CLAIM_KEY) or b"{}")
    assert claim.get("state") == "ended" or claim.get("pid") != child_pid, claim


def test_a_run_that_leaves_a_key_fails_naming_it(tmp_path: Path) -> None:
    child = _child(tmp_path, PROBE_LEAVE="1")
    rc, out, url = _finish(child)
    assert rc == 1, out
    assert "this run left 1 key(s) in Redis database" in out and "leftover-probe" in out
    assert "1 passed" in out  # the test itself passed: the leftover alone failed the run
    r = connect(url)
    try:
        assert r.exists("leftover-probe") == 0  # deleted, so the next run finds the database clean
        _assert_claim_ended(r, child.pid)
    finally:
        r.close()


def test_concurrent_runs_write_to_databases_of_their_own(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    runs = [_child(tmp_path / name, PROBE_SLEEP="3") for name in ("a", "b")]
    (rc_a, out_a, url_a), (rc_b, out_b, url_b) = (_finish(p) for p in runs)
    assert (rc_a, rc_b) == (0, 0), out_a + out_b
    assert url_a != url_b, (url_a, url_b)
    assert not url_a.endswith("/0") and not url_b.endswith("/0")  # database 0 is left to people


XDIST_PROBE = """
import os
import redis

def test_probe_{n}(redis_url):
    with open(os.environ["PROBE_URLS"], "a") as f:
        f.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {{redis_url}}\\n")
    r = redis.Redis.from_url(redis_url)
    r.set("leftover-probe-{n}", "x")
    if {n} == 1:
        r.delete("leftover-probe-{n}")
    r.close()
"""


def test_a_parallel_run_shares_one_database_and_checks_it_once_at_the_end(tmp_path: Path) -> None:
    # Given two probe tests on two xdist workers, the second leaving its key
    for n in (1, 2):
        (tmp_path / f"test_probe_{n}.py").write_text(XDIST_PROBE.format(n=n))
    urls = tmp_path / "urls.txt"
    # When the run ends
    p = _pytest(tmp_path, ["-n", "2", "--dist", "loadfile", str(tmp_path)], {"PROBE_URLS": str(urls)})
    out, _ = p.communicate(timeout=180)
    # Then both workers wrote to the one database the run claimed
    seen = dict(line.split() for line in urls.read_text().splitlines())
    assert sorted(seen) == ["gw0", "gw1"] and len(set(seen.values())) == 1, seen
    url = seen["gw0"]
    assert not url.endswith("/0"), url
    # ... and the run failed once, naming the key the second test left, which is deleted now
    assert p.returncode == 1 and "2 passed" in out, out
    assert out.count("this run left 1 key(s) in Redis database") == 1 and "leftover-probe-2" in out, out
    r = connect(url)
    try:
        assert r.exists("leftover-probe-2") == 0
        _assert_claim_ended(r, p.pid)
    finally:
        r.close()
