"""A Redis permission refused while a worker runs is told from every other failure: a ``NOPERM`` reply,
the same refusal of a call inside a script, or either as the cause of another exception."""

from __future__ import annotations

from rewardq.consumers.failures import permission_refusal
from rewardq.errors import RedisPermissionError, ScoringError
from rewardq.queue.connection import NoPermissionError, ResponseError

NS, URL = "ns", "redis://w:secret@127.0.0.1:6379/0"
IN_SCRIPT = "The user executing the script can't run this command or subcommand script: f379, on @user_script:38."


def test_a_refusal_sent_directly_or_inside_a_script_is_one_line_naming_the_grant() -> None:
    for exc in [
        NoPermissionError("this user has no permissions to run the 'evalsha' command"),
        ResponseError(IN_SCRIPT),
    ]:
        err = permission_refusal(exc, NS, URL)
        assert isinstance(err, RedisPermissionError) and err.exit_code == 2
        text = str(err)
        assert "\n" not in text and "NOPERM" in text and "ACL SETUSER w ~ns:*" in text and "secret" not in text
        assert ".." not in text


def test_a_refusal_that_caused_another_error_is_found_and_others_are_not() -> None:
    try:
        try:
            raise NoPermissionError("this user has no permissions to run the 'evalsha' command")
        except NoPermissionError as inner:
            raise ScoringError("the judge cache failed") from inner
    except ScoringError as outer:
        assert permission_refusal(outer, NS, URL) is not None
    assert permission_refusal(ResponseError("NOSCRIPT No matching script"), NS, URL) is None
    assert permission_refusal(RuntimeError("boom"), NS, URL) is None
    already = RedisPermissionError("Redis user 'w' lacks ...")
    assert permission_refusal(already, NS, URL) is already
