"""``rewardq worker`` refuses what it can before it imports torch (a start-up's slowest part):
an unknown ``--manager``, no ``--tokenizer``, a tokenizer path or a manager file that is not there.
Each exits 2 with the message that says what to fix, having imported neither torch nor tensordict,
and no log line names a tokenizer it does not have."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.cli_procs import REPO

UNREACHABLE = "redis://127.0.0.1:1/0"  # never reached: the refusal comes first


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--manager", "no-such-manager", "--tokenizer", "builtin:demo"], "unknown reward manager 'no-such-manager'"),
        (["--manager", "naive"], "no tokenizer given"),
        (["--tokenizer", "/no/such/tokenizer"], "tokenizer path '/no/such/tokenizer' does not exist"),
        (["--tokenizer", "builtin:other"], "unknown built-in tokenizer 'builtin:other'"),
        (["--manager", "/no/such/file.py:Mine", "--tokenizer", "builtin:demo"], "no such file '/no/such/file.py'"),
    ],
    ids=["manager", "no-tokenizer", "tokenizer-path", "builtin", "manager-file"],
)
def test_refused_before_torch_is_imported(args: list[str], says: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDQ_")}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rewardq", "worker", "--redis-url", UNREACHABLE, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    log = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    assert proc.returncode == 2, log[-2000:]
    assert says in log, log[-2000:]
    assert "rewardq.cli" in imported  # the import log was read
    assert not {"torch", "tensordict"} & imported, sorted(m for m in imported if m.startswith(("torch", "tensordict")))
    assert "loading the tokenizer" not in log and "connecting to Redis" not in log
