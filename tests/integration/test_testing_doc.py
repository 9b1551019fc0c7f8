"""``docs/testing.md`` works as written: its files, put in a folder, pass ``python -m pytest`` there.

Given every ``python file=NAME`` block of the page, written out as a user would save them, when
pytest runs in that folder (a fresh process, none of rewardq's own conftest), then every test of
the page passes, and the page's tests are really run (counted).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.cli_procs import REPO

DOC = REPO / "docs" / "testing.md"
BLOCK = re.compile(r"^```python file=(\S+)\n(.*?)^```", re.S | re.M)


def test_the_page_shows_a_scoring_function_and_a_manager_with_their_tests() -> None:
    files = dict(BLOCK.findall(DOC.read_text()))
    assert set(files) == {"my_rewards.py", "test_my_rewards.py", "my_manager.py", "test_my_manager.py"}
    for helper in ("score_response", "make_batch", "score_trajectory_sync", "ManagerRunner", "worker_manager"):
        assert helper in files["test_my_rewards.py"] + files["test_my_manager.py"], helper


def test_the_pages_examples_pass_as_a_user_runs_them(tmp_path: Path) -> None:
    files = dict(BLOCK.findall(DOC.read_text()))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REWARDQ_", "PYTEST_"))}
    env["PYTHONPATH"] = str(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    tests = sum(len(re.findall(r"^def test_", t, re.M)) for n, t in files.items() if n.startswith("test_"))
    assert f"{tests} passed" in run.stdout, run.stdout[-2000:]
