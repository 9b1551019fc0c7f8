"""The scoring fingerprint is the same in every process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rewardq.reward.scoring_fingerprint import scoring_fingerprint
from tests.unit.test_scoring_fingerprint import REPO, TOK, _cfg, _reward_file


def test_stable_across_processes(tmp_path: Path) -> None:
    path = _reward_file(tmp_path)
    code = (
        "from rewardq.config import WorkerConfig\n"
        "from rewardq.reward.scoring_fingerprint import differences, scoring_fingerprint\n"
        f"cfg = WorkerConfig(tokenizer='builtin:demo', manager='dapo', reward_fn={str(path)!r}, "
        "manager_options={'b': [1, 2], 'a': {'y': 1, 'x': 2}}, reward_fn_kwargs={'k': 1})\n"
        f"print(scoring_fingerprint(cfg, {TOK!r}).digest)\n"
    )
    env = {"PYTHONHASHSEED": "random", "PATH": "/usr/bin:/bin"}
    digests = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO, env=env
        ).stdout.strip()
        for _ in range(2)
    }
    here = scoring_fingerprint(
        _cfg(
            manager="dapo",
            reward_fn=str(path),
            manager_options={"a": {"x": 2, "y": 1}, "b": [1, 2]},  # another key order: the same options
            reward_fn_kwargs={"k": 1},
        ),
        TOK,
    )
    assert digests == {here.digest}, digests
