"""One mapping from an error to a command's exit code, for the CLI and a worker's forced exit."""

from __future__ import annotations

import pytest
from redis import exceptions as redis_errors

from rewardq.errors import NotFound, RedisUnavailable, ScoringConflict
from rewardq.exit_codes import exit_code_of, explain


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ScoringConflict("another configuration took over"), 2),
        (RedisUnavailable("no answer"), 3),
        (NotFound("no such key"), 1),
        (redis_errors.NoPermissionError("NOPERM no evalsha"), 2),
        (redis_errors.ConnectionError("reset by peer"), 3),
        (redis_errors.TimeoutError("timed out"), 3),
        (ModuleNotFoundError("No module named 'torch'", name="torch"), 2),
        (KeyboardInterrupt(), 130),
        (ValueError("a bug"), 1),
        (ModuleNotFoundError("No module named 'nothing_of_ours'", name="nothing_of_ours"), 1),
    ],
)
def test_each_error_ends_a_command_with_its_code(exc: BaseException, code: int) -> None:
    assert exit_code_of(exc) == code


def test_an_expected_error_is_explained_in_one_line_and_a_bug_is_not() -> None:
    code, line = explain(redis_errors.NoPermissionError("NOPERM this user has no permissions")) or (0, "")
    assert code == 2 and "ACL user" in line and "\n" not in line
    code, line = explain(ModuleNotFoundError("No module named 'torch'", name="torch")) or (0, "")
    assert code == 2 and "torch" in line and "pip install" in line
    assert explain(RuntimeError("unexpected")) is None
