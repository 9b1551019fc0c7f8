"""A ledger folder that cannot be made or written is one line naming the setting, exit code 2.

``rewardq worker --ledger`` / ``--ledger-spool`` and ``rewardq replay --out`` / ``--ledger-spool``,
run as real processes: a file where a folder must be, a folder this user may not write in, and
what the system refuses beyond those checks (a name too long), each refused with the setting,
the path and what is wrong, no traceback, and nothing left in Redis or on disk.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.cli_procs import Procs
from tests.support.ledger_rows import trajectory_rows, write_ledger
from tests.support.sync_client import SyncClient

pytestmark = pytest.mark.slow

#: Runs a command as an unprivileged user (uid 1000 in a user namespace of its own): a folder
#: without write permission refuses it even when the test runs as root.
AS_USER = ["unshare", "-U", "--map-user=1000", "--map-group=1000"]


def _refusals(procs: Procs, cases: dict[str, list[str]]) -> dict[str, str]:
    """Run each ``rewardq`` command of ``cases`` side by side; each must exit 2 with one error line:
    those lines by case."""
    started = {name: procs.start(args, tag=name) for name, args in cases.items()}
    rc = {name: p.wait(120) for name, p in started.items()}
    err = {name: _one_error_line(p.stderr()) for name, p in started.items()}
    assert set(rc.values()) == {2}, (rc, err)
    return err


def _one_error_line(text: str) -> str:
    assert "Traceback" not in text and "this is a bug" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, text
    return lines[0]


def test_worker_ledger_folders_that_cannot_be_used_are_one_config_error(
    procs: Procs, tmp_path: Path, redis_url: str, ns: str, sync_redis: SyncClient
) -> None:
    # Given a file where the ledger's folder must be, and a good ledger folder
    (tmp_path / "afile").write_text("")
    (tmp_path / "good").mkdir()
    base = ["worker", "--redis-url", redis_url, "--namespace", ns, "--tokenizer", "builtin:demo"]
    cases = {
        "ledger": [*base, "--ledger", "afile/led"],
        "spool": [*base, "--ledger", "good", "--ledger-spool", "afile/spool"],
    }
    # When each worker starts, then each exits 2 with one line naming the setting, the path and what is wrong
    err = _refusals(procs, cases)
    assert "ledger afile/led: a file" in err["ledger"] and "where a folder must be" in err["ledger"]
    assert str(tmp_path / "afile") in err["ledger"]
    assert "ledger_spool afile/spool: a file" in err["spool"] and "where a folder must be" in err["spool"]
    # And they were refused before the worker connected: nothing in Redis
    assert not list(sync_redis.scan_iter(f"{ns}*"))

    # When the system refuses what no check foresees (a folder name of 300 bytes), once connected
    long = procs.start([*base, "--ledger", "good", "--ledger-spool", f"good/{'x' * 300}"], tag="too-long")
    # Then that is the same one line, with the system's reason
    assert long.wait(120) == 2, long.stderr()
    line = _one_error_line(long.stderr())
    assert f"ledger_spool good/{'x' * 300}" in line and "File name too long" in line, line


def test_a_worker_refuses_a_ledger_folder_it_may_not_write_in(procs: Procs, tmp_path: Path, ns: str) -> None:
    if not shutil.which("unshare"):
        pytest.skip("needs util-linux's unshare")
    # Given a folder nobody may write in, and a worker run as an unprivileged user
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    args = ["worker", "--namespace", ns, "--tokenizer", "builtin:demo", "--ledger", "locked/led"]
    # When it starts
    p = procs.start(args, tag="locked", prefix=AS_USER)
    # Then it exits 2 naming the setting, the path, and that the folder is not writable
    assert p.wait(120) == 2, p.stderr()
    line = _one_error_line(p.stderr())
    assert "ledger locked/led" in line and "not writable (permission denied)" in line, line
    assert str(locked) in line


def test_replay_out_and_spool_folders_that_cannot_be_used_are_one_config_error(procs: Procs, tmp_path: Path) -> None:
    # Given a ledger to replay and a file where a folder must be
    write_ledger(tmp_path / "src", trajectory_rows("a"))
    (tmp_path / "afile").write_text("")
    base = ["replay", "src", "--tokenizer", "builtin:demo"]
    cases = {
        "out": [*base, "--out", "afile/new"],
        "spool": [*base, "--out", "new", "--ledger-spool", "afile/spool"],
    }
    # When each replay starts, then each exits 2 naming its setting and path, before it made anything
    err = _refusals(procs, cases)
    assert "--out afile/new: a file" in err["out"] and "where a folder must be" in err["out"]
    assert "ledger_spool afile/spool: a file" in err["spool"]
    assert not (tmp_path / "new").exists()
