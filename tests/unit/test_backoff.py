"""One backoff, :func:`rewardq.backoff.compute_backoff`, for every loop that retries.

Given the schedules rewardq's retrying loops use, the pauses are the ones each documents: the
Redis policy's equal jitter, the supervisor's doubling restarts, the worker's retries in place of
transient scoring failures (:mod:`rewardq.consumers.retries`), and a linear schedule as verl's
SandboxFusion client runs it (``INITIAL_RETRY_DELAY * (attempt + 1)``).
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import pytest

import rewardq
from rewardq.backoff import compute_backoff
from rewardq.queue import retry

PACKAGE = Path(rewardq.__file__).parent


def test_exponential_doubles_from_base_up_to_cap_without_jitter() -> None:
    assert [compute_backoff(k, base=1.0, cap=30.0) for k in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert compute_backoff(0, base=0.5) == compute_backoff(1, base=0.5) == 0.5  # no failure counts as one
    assert compute_backoff(5000, base=0.1, cap=2.0) == 2.0  # no overflow for a long outage
    assert math.isfinite(compute_backoff(5000, base=0.1))  # uncapped: huge, but a number


def test_linear_adds_the_base_each_time() -> None:
    # verl's SandboxFusion schedule: delay = INITIAL_RETRY_DELAY * (attempt + 1)
    assert [compute_backoff(k, base=1.0, growth="linear") for k in range(1, 4)] == [1.0, 2.0, 3.0]
    assert compute_backoff(50, base=1.0, cap=30.0, growth="linear") == 30.0


@pytest.mark.parametrize("jitter", [0.0, 0.2, 0.5, 1.0])
def test_jitter_takes_up_to_its_share_off_the_step(jitter: float) -> None:
    step = compute_backoff(3, base=1.0)
    assert compute_backoff(3, base=1.0, jitter=jitter, rand=lambda: 0.0) == step
    assert compute_backoff(3, base=1.0, jitter=jitter, rand=lambda: 0.999999) == pytest.approx(
        step * (1 - jitter), abs=1e-5
    )


def test_the_redis_policy_is_equal_jitter_within_base_and_cap() -> None:
    pauses = [retry.backoff_delay(k) for k in range(1, 12) for _ in range(20)]
    assert all(retry.BASE / 2 <= p <= retry.CAP for p in pauses)
    assert max(retry.backoff_delay(10) for _ in range(200)) > retry.CAP * 0.75  # the random half is drawn
    assert min(retry.backoff_delay(10) for _ in range(200)) >= retry.CAP / 2  # the fixed half is kept


@pytest.mark.parametrize("bad", [dict(base=-1.0), dict(base=1.0, jitter=1.5), dict(base=1.0, growth="cubic")])
def test_nonsense_schedules_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        compute_backoff(1, **bad)


def test_no_retrying_loop_computes_its_own_backoff() -> None:
    # Given every module of the package, no expression doubles a pause by hand (`x * 2 ** n`)
    # or grows it in a loop (`backoff * 2`): pauses come from compute_backoff
    hand_made = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "backoff.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
                base = node.left
                if isinstance(base, ast.Constant) and base.value == 2 and not isinstance(node.right, ast.Constant):
                    hand_made.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not hand_made, hand_made
