"""A setting declared in one file reaches every door of an installed copy (run as subprocesses)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_procs import REPO

# -- adding a setting is a one-file change ------------------------------------------------------

NEW_SETTING = '    probe_knob: float = setting(2.5, "Seconds a knob added by a test waits.", above=0)\n'


@pytest.fixture(scope="module")
def patched_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the rewardq package whose config.py alone gained one declaration."""
    root = tmp_path_factory.mktemp("one-file-change")
    shutil.copytree(REPO / "rewardq", root / "rewardq", ignore=shutil.ignore_patterns("__pycache__"))
    config = root / "rewardq" / "config.py"
    text = config.read_text()
    anchor = "    # observability\n"
    assert text.count(anchor) == 1
    config.write_text(text.replace(anchor, NEW_SETTING + anchor))
    changed = [
        p.relative_to(root)
        for p in (root / "rewardq").rglob("*")
        if p.is_file() and p.read_bytes() != (REPO / p.relative_to(root)).read_bytes()
    ]
    assert changed == [Path("rewardq/config.py")]
    return root


def run_copy(root: Path, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("REWARDQ_")}
    full.update(env or {}, PYTHONPATH=str(root))
    return subprocess.run(
        [sys.executable, "-m", "rewardq", *args], env=full, cwd=root, capture_output=True, text=True, timeout=120
    )


def test_a_setting_declared_in_one_file_reaches_every_door(patched_package: Path, tmp_path: Path) -> None:
    root = patched_package
    # Then --help shows its flag, default and variable
    help_ = run_copy(root, ["worker", "--help"])
    assert help_.returncode == 0, help_.stderr
    words = " ".join(help_.stdout.split())  # click wraps at the terminal's width
    assert "--probe-knob FLOAT Seconds a knob added by a test waits. [default: 2.5; env: REWARDQ_PROBE_KNOB]" in words

    # And the flag, the environment and the config file set it, each named as the source
    f = tmp_path / "rq.yaml"
    f.write_text("probe_knob: 4.5\n")
    seen = {}
    for how, args, env in (
        ("default", [], {}),
        ("flag", ["--probe-knob", "3.5"], {}),
        ("env", [], {"REWARDQ_PROBE_KNOB": "5.5"}),
        ("file", ["--config", str(f)], {}),
    ):
        r = run_copy(root, ["config", "--json", *args], env=env)
        assert r.returncode == 0, r.stderr
        row = json.loads(r.stdout)["probe_knob"]
        seen[how] = (row["value"], row["source"])
    assert seen == {
        "default": (2.5, "default"),
        "flag": (3.5, "flag --probe-knob"),
        "env": (5.5, "env REWARDQ_PROBE_KNOB"),
        "file": (4.5, f"file {f}"),
    }
    # And its bounds are checked like every other setting's
    bad = run_copy(root, ["config", "--probe-knob", "0"])
    assert (
        bad.returncode == 2 and "probe_knob must be a positive number, got 0.0 (from flag --probe-knob)" in bad.stderr
    )

    # And a starting worker logs it in its effective config (here before it gives up on an unreachable Redis)
    w = run_copy(
        root,
        ["worker", "--redis-url", "redis://127.0.0.1:1/0", "--connect-timeout", "0.5", "--log-format", "json"]
        + ["--tokenizer", "builtin:demo"],
        env={"REWARDQ_PROBE_KNOB": "6.5"},
    )
    assert w.returncode == 3, w.stderr
    effective = next(json.loads(x) for x in w.stderr.splitlines() if "effective config" in x)
    assert effective["config"]["probe_knob"] == 6.5
    assert effective["sources"]["probe_knob"] == "env REWARDQ_PROBE_KNOB"
