"""rewardq.testing runs a reward function where a worker runs it: in a scorer process."""

from __future__ import annotations

import os
from pathlib import Path

from rewardq.testing import (
    score_response,
)
from tests.support.helpers import SAMPLE
from tests.unit.test_testing import REWARD_FILE


async def test_score_response_runs_the_function_where_the_worker_runs_it(tmp_path: Path) -> None:
    fn = tmp_path / "my_rewards.py"
    fn.write_text(REWARD_FILE)
    spec = f"{fn}:compute_score"
    in_process = await score_response("42", SAMPLE, reward_fn=spec, reward_fn_kwargs={"bonus": 0.5})
    assert in_process.ok and in_process.reward_score == 1.5
    assert in_process.reward_extra_info["seen"] == "42" and in_process.reward_extra_info["split"] == "train"
    assert in_process.reward_extra_info["pid"] != os.getpid()  # a scorer process, as in a worker
    inline = await score_response("41", SAMPLE, reward_fn=spec, reward_fn_placement="inline")
    assert inline.reward_score == 0.0 and inline.reward_extra_info["pid"] == os.getpid()
